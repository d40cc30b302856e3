"""Static group membership (CALLQA_WORKER_INSTANCE_ID): a worker restarted under its instance id gets its
partitions back without a rebalance, so the other workers' calls never pause for it; without one, the
same restart rebalances them twice (the leave, then the join); a static member's successor started beside it
(standby) takes over when it exits, as a restart does. Real broker, real worker processes."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from pipeline.broker.groups import wait_for_members
from pipeline.config import Settings
from pipeline.worker.instance_lock import STANDBY_READY

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REBALANCES = "callqa_rebalances_total"


@pytest.mark.parametrize(("instance_ids", "standby"), [(("worker-a", "worker-b"), False),
                                                     (("worker-a", "worker-b"), True), (("", ""), False)],
                         ids=["static", "standby", "dynamic"])
def test_a_restart_rebalances_the_other_worker_only_without_an_instance_id(
    kafka_settings: Settings, start_worker: Any, tmp_path: Path, instance_ids: tuple[str, str], standby: bool
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap})

    def members() -> list[set[int]]:
        return wait_for_members(admin, kafka_settings.worker_id, kafka_settings.topic_audio,
                                kafka_settings.audio_partitions, 2, timeout_s=180,
                                check=lambda: None if a.alive() and b.alive() else pytest.fail("a worker died"))

    # A session timeout longer than a restart: the broker keeps a static member's place that long.
    a = start_worker(worker_instance_id=instance_ids[0], kafka_session_timeout_s="60",
                     clickhouse_url=f"chdb://{tmp_path / 'a'}")
    b = start_worker(worker_instance_id=instance_ids[1], kafka_session_timeout_s="60",
                     clickhouse_url=f"chdb://{tmp_path / 'b'}")
    before = sorted(map(sorted, members()))
    time.sleep(3)  # any rebalance the second join started is over
    seen = a.metric(REBALANCES)

    if standby:
        # Its successor starts first, loads its model and waits on the instance's lock while b serves; b's
        # exit hands it the instance, its store and its partitions (pipeline/worker/instance_lock.py).
        old_pid = b.pid
        code, _ = b.hand_over()
        assert code == 0 and b.pid != old_pid
        log = b.log_text()
        assert log.index(STANDBY_READY) < log.index("taking over instance 'worker-b'")
    else:
        b.stop()
        # Back on another web port, as a pod rescheduled with another address: faust's assignor asserted that
        # the URL in the assignment kept from its last life was its own, and its group coordination died.
        b.new_web_port()
        b.start()
    after = sorted(map(sorted, members()))
    deadline = time.monotonic() + 20
    while b.metric(REBALANCES) < 1 and time.monotonic() < deadline:  # the restarted worker has its partitions
        time.sleep(0.5)
    assert b.metric(REBALANCES) >= 1, "the restarted worker never took its partitions"
    time.sleep(3)
    with urllib.request.urlopen(f"http://127.0.0.1:{b.web_port}/health", timeout=10) as answer:
        assert answer.status == 200  # and its group coordination is alive
    if instance_ids[0]:
        assert a.metric(REBALANCES) == seen, "the other worker was rebalanced by a static member's restart"
        assert after == before  # each worker kept its partitions
    else:
        assert a.metric(REBALANCES) >= seen + 1  # the control: a dynamic member's restart moves everyone
