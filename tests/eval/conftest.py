"""The evaluation set, loaded once per test session."""

from __future__ import annotations

import pytest

from pipeline.eval.dataset import EvalUtterance, load_eval_set


@pytest.fixture(scope="session")
def eval_set() -> list[EvalUtterance]:
    return load_eval_set()
