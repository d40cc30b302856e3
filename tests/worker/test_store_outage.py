"""A SIGTERM while the store refuses every insert: the worker still exits, cleanly and within its bound
(it used to retry until the store came back, and a supervisor's SIGKILL came first), having committed
nothing it did not store; the next worker, with the store back, stores the call whole.

Real broker, real worker processes (their store refuses inserts while a file exists:
pipeline/bench/store_fault.py), a library call replayed as fast as it goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.bench.workers import WorkerProcess
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CALL = Path(__file__).resolve().parents[2] / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"
EXIT_BOUND_S = 8.0  # the worker's unhealthy_exit_timeout_s here: drain and close get half of it each


def _wait(condition: Callable[[], bool], what: str, worker: WorkerProcess, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {worker.log_tail()}")
        time.sleep(0.3)


def test_a_sigterm_during_a_store_outage_exits_and_the_next_worker_stores_the_call_whole(
        kafka_settings: Settings, start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> None:
    refusing = tmp_path / "store-refuses"
    first = start_worker(fault_file=refusing, unhealthy_exit_timeout_s=str(EXIT_BOUND_S))
    refusing.touch()
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    (call_id,) = player.run([load_recording(CALL, ReplayOptions())], ReplayOptions()).call_ids
    _wait(lambda: first.metric("callqa_store_retries") >= 2, "no insert was refused", first)

    assert first.proc is not None
    first.proc.terminate()  # SIGTERM; the store still refuses every insert
    try:
        first.proc.wait(timeout=60)  # without a bound it waits for the store, which never comes back here
    except Exception:
        pytest.fail(f"SIGTERM during a store outage: still running after 60 s: {first.log_tail()}")
    assert first.exit_code == 0
    assert "store sink did not close cleanly" in first.log_tail(), "the sink did not give up: nothing was pending?"

    refusing.unlink()
    second = start_worker()
    _wait(lambda: bool(second.query("SELECT call_id FROM calls_deduped WHERE call_id = {c:String}", c=call_id)),
          "the call was not stored by the next worker", second)
    (row,) = second.query("SELECT end_reason, segments FROM calls_deduped WHERE call_id = {c:String}", c=call_id)
    stored = second.query("SELECT count() AS n, uniqExact(segment_id) AS ids FROM segments FINAL "
                          "WHERE call_id = {c:String} AND is_final = 1", c=call_id)[0]
    assert row["end_reason"] == "end" and row["segments"] > 0
    assert stored["n"] == stored["ids"] == row["segments"]  # every segment once
