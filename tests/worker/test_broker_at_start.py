"""A worker started while its broker is down waits for it (CALLQA_KAFKA_START_WAIT_S) instead of exiting:
a host's boot or a compose file starts both at once, and a cluster's restart may outlast a worker's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.bench.chaos import private_broker
from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.groups import wait_for_members
from pipeline.broker.local import free_port
from pipeline.broker.security import ClientErrors, admin_client
from pipeline.config import Settings

WAITING = "waiting for Kafka at "


def _log_says(worker: WorkerProcess, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in worker.log_text():
            return True
        if worker.proc is not None and worker.proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def _worker(tmp_path: Path, bootstrap: str, **overrides: str) -> WorkerProcess:
    port = free_port()
    env = worker_env({"bootstrap_servers": bootstrap, "kafka_security_protocol": "PLAINTEXT",
                      "worker_id": "start-wait", "web_port": str(port), "state_dir": str(tmp_path / "state"),
                      "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}", "recordings": "false",
                      "model_watch_interval_s": "0", **overrides})
    return WorkerProcess(env, port, tmp_path / "worker.log")


@pytest.mark.broker
@pytest.mark.slow
def test_a_worker_started_before_its_broker_waits_for_it_then_joins_its_group(tmp_path: Path) -> None:
    kafka = private_broker(tmp_path / "broker")  # not started yet: its address answers nothing
    worker = _worker(tmp_path, kafka.settings.bootstrap)
    worker.spawn()
    try:
        assert _log_says(worker, WAITING, 60), f"the worker did not say it waits for Kafka: {worker.why()}"
        time.sleep(3)  # a few more of its asks unanswered
        assert worker.proc is not None and worker.proc.poll() is None, f"the worker gave up: {worker.why()}"
        kafka.start()
        worker.wait_serving(180)
        settings = Settings(bootstrap_servers=kafka.settings.bootstrap, kafka_security_protocol="PLAINTEXT",
                            worker_id="start-wait")
        admin = admin_client(settings, ClientErrors(settings))
        # The worker made its topics on the broker that came up, and its consumer holds every audio partition.
        members = wait_for_members(admin, settings.worker_id, settings.topic_audio, settings.audio_partitions, 1,
                                   timeout_s=120)
        assert set().union(*members) == set(range(settings.audio_partitions))
    finally:
        worker.stop()
        kafka.stop()


def test_a_worker_whose_broker_never_answers_exits_after_its_wait_with_one_line(tmp_path: Path) -> None:
    worker = _worker(tmp_path, f"127.0.0.1:{free_port()}", kafka_start_wait_s="4")
    began = time.monotonic()
    worker.spawn()
    assert worker.proc is not None
    assert worker.proc.wait(timeout=60) == 1
    took = time.monotonic() - began
    log = worker.log_text()
    assert WAITING in log
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer within 4 s (CALLQA_KAFKA_START_WAIT_S)" in errors[0], log
    assert "Traceback" not in log
    assert took >= 4, f"exited after {took:.1f} s, before its 4 s wait was out"
