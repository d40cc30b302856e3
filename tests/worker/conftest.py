"""Fixtures that run the real worker (`callqa worker`) as a process against the real broker."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.local import free_port
from pipeline.config import Settings


@pytest.fixture
def start_worker(kafka_settings: Settings, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers on this test's topics, with a store of their own; all stopped at the end."""
    started: list[WorkerProcess] = []
    # Numbered when asked for, not when up: two workers started at once from threads get their own logs.
    numbers = itertools.count()
    base = {
        "bootstrap_servers": kafka_settings.bootstrap,
        "topic_audio": kafka_settings.topic_audio,
        "topic_call_events": kafka_settings.topic_call_events,
        "topic_transcripts": kafka_settings.topic_transcripts,
        "topic_latency": kafka_settings.topic_latency,
        "topic_qa": kafka_settings.topic_qa,
        "topic_dead_letters": kafka_settings.topic_dead_letters,
        "topic_checkpoints": kafka_settings.topic_checkpoints,
        "topic_postcall": kafka_settings.topic_postcall,
        "topic_live_calls": kafka_settings.topic_live_calls,
        "worker_id": kafka_settings.worker_id,
        "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}",
        # Off here: these tests' subject is the live path, and a recording per finished call (its audio read back,
        # its cuts decoded again, Opus) costs every churn test CPU. Recordings are tested with the default on in
        # test_recordings.py (and run on in test_browser and the gateway's end-to-end test, which use defaults).
        "recordings": "false",
        "recordings_url": str((tmp_path / "recordings").resolve()),
        "commit_interval_s": "1.0",
        "model_watch_interval_s": "0",
    }

    def start(loglevel: str = "info", fault_file: Path | None = None, **overrides: str) -> WorkerProcess:
        """A worker; ``fault_file``: its store refuses inserts while that file exists (bench/store_fault.py)."""
        port = free_port()
        w = WorkerProcess(worker_env({**base, "web_port": str(port), **overrides}), port,
                          tmp_path / f"worker{next(numbers)}.log", loglevel=loglevel, fault_file=fault_file)
        started.append(w)  # before it is up: one that never comes up is still stopped at the end
        w.start()
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def start_group_worker(start_worker: Callable[..., WorkerProcess],
                       tmp_path: Path) -> Callable[..., WorkerProcess]:
    """Start one more worker of this test's consumer group with an embedded store of its OWN, as
    separate worker hosts have (chdb opens a folder from one process only); stopped at the end."""
    stores = itertools.count()

    def start(loglevel: str = "info", **overrides: str) -> WorkerProcess:
        store = (tmp_path / f"store{next(stores)}").resolve()
        return start_worker(loglevel, clickhouse_url=f"chdb://{store}", **overrides)

    return start
