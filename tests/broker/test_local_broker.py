"""The project's own broker: one per state folder, clean stop, nothing left behind."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.broker.local import LocalKafka, free_port
from pipeline.config import Settings

pytestmark = pytest.mark.broker



def processes_naming(root: Path) -> list[int]:
    marker = f"-Dcallqa.broker.root={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_starts_at_once_share_one_broker_and_stop_leaves_nothing(tmp_path: Path, broker: str) -> None:
    # A broker of its own (own folder and ports), so the session's broker keeps serving other tests.
    settings = Settings(state_dir=tmp_path, kafka_port=free_port(), kafka_controller_port=free_port())
    kafka = LocalKafka(settings)
    # Reuse the jars the session already resolved rather than resolving them again.
    shared_libs = LocalKafka(Settings()).libs
    kafka.libs.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(shared_libs, kafka.libs)

    # Two starts at once (pytest's workers do this when no broker runs): they used to race, and the
    # loser's clean-up deleted the winner's PID file, leaving a broker that `stop` could not find.
    with ThreadPoolExecutor(2) as pool:
        first, second = sorted(pool.map(lambda _: LocalKafka(settings).start(), range(2)),
                               key=lambda r: r.already_running)
    try:
        assert not first.already_running
        assert first.ready_after_s > 0
        assert second.already_running and second.pid == first.pid
        assert kafka.pid() == first.pid
        assert kafka.start().already_running
        assert processes_naming(kafka.root) == [first.pid]
        status = kafka.status()
        assert status.running and status.answers_metadata
    finally:
        assert kafka.stop() is True
    assert processes_naming(kafka.root) == []
    assert kafka.stop() is False  # idempotent
    assert not kafka.status().running
