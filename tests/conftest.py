"""Root fixtures shared by every test package.

chdb (the embedded ClickHouse engine) allows one data path per process, so the whole pytest session
shares one path; tests isolate themselves with a database of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Absolute path of the one chdb data folder of this test session."""
    return str(Path(tmp_path_factory.mktemp("chdb")).resolve())


@pytest.fixture
def unique_name() -> Iterator[str]:
    """A fresh identifier for topics, databases or consumer groups of one test."""
    yield f"t{uuid.uuid4().hex[:12]}"
