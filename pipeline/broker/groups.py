"""What a consumer group of workers holds: its state, each member's partitions of one topic, its commits.

Benchmarks and scale-out checks wait on this before they send traffic: frames sent while the group is
still rebalancing would only queue up and count as latency that no deployment sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from pipeline.broker.security import kafka_config
from pipeline.config.broker import BrokerSettings

# How often a wait asks the group coordinator again.
POLL_S = 0.5


class GroupNotStableError(RuntimeError):
    """The group did not settle with the members expected in time; the message says its last state."""


def group_assignment(admin: AdminClient, group_id: str, topic: str) -> tuple[str, list[set[int]]]:
    """The group's state name and each member's partitions of ``topic`` ("UNKNOWN", [] while the group is
    not known yet)."""
    state, members = group_members(admin, group_id, topic)
    return state, list(members.values())


def group_members(admin: AdminClient, group_id: str, topic: str) -> tuple[str, dict[str, set[int]]]:
    """The group's state name and each member's (by member id) partitions of ``topic``."""
    try:
        desc = admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result()
    except Exception:  # noqa: BLE001 - not created yet, or its coordinator loading: unknown for now
        return "UNKNOWN", {}
    return desc.state.name, {m.member_id: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic}
                             for m in desc.members}


def wait_for_takeover(admin: AdminClient, group_id: str, topic: str, partitions: int, before: set[str],
                      timeout_s: float = 120.0, poll_s: float = 0.1) -> float | None:
    """Seconds until the group is stable again without one of the members in ``before`` (one was killed)
    and every partition of ``topic`` has an owner: when a killed member's partitions are taken over.
    None if that does not happen within ``timeout_s``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        state, members = group_members(admin, group_id, topic)
        owned = set().union(*members.values()) if members else set()
        if state == "STABLE" and before - set(members) and len(owned) == partitions:
            return time.monotonic() - began
        time.sleep(poll_s)
    return None


def wait_for_members(admin: AdminClient, group_id: str, topic: str, partitions: int, count: int,
                     timeout_s: float = 120.0, check: Callable[[], None] = lambda: None) -> list[set[int]]:
    """Until ``count`` members hold all ``partitions`` of ``topic`` between them in a stable group; returns
    each member's partitions. ``check`` runs at every poll (e.g. raise if a worker died)."""
    deadline = time.monotonic() + timeout_s
    state, members = "UNKNOWN", list[set[int]]()
    while time.monotonic() < deadline:
        state, members = group_assignment(admin, group_id, topic)
        owned = set().union(*members) if members else set()
        if state == "STABLE" and len(members) == count and len(owned) == partitions:
            return members
        check()
        time.sleep(POLL_S)
    raise GroupNotStableError(f"consumer group {group_id} not stable with {count} members in {timeout_s:.0f} s "
                              f"(state {state}, {len(members)} members)")


def committed_offsets(settings: BrokerSettings, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed on each partition of ``topic`` (partitions without a commit
    are left out). Asks the group coordinator without joining the group, so no rebalance is caused."""
    consumer = Consumer({**kafka_config(settings), "group.id": group, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        asked = [TopicPartition(topic, p) for p in sorted(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=10) if tp.offset >= 0}
    finally:
        consumer.close()


def session_timeout_bounds(admin: AdminClient, timeout_s: float = 10.0) -> tuple[float, float] | None:
    """The brokers' allowed consumer session timeouts (``group.min/max.session.timeout.ms``, s); None when
    they cannot be read (no DescribeConfigs permission, an old broker): then the setting is used as is."""
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
        resource = ConfigResource(ConfigResource.Type.BROKER, str(min(brokers)))
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
        return (int(configs["group.min.session.timeout.ms"].value) / 1000,
                int(configs["group.max.session.timeout.ms"].value) / 1000)
    except Exception:  # noqa: BLE001 - unknown bounds: the join says so if the setting is outside them
        return None


def fitted_session_timeout(wanted_s: float, bounds: tuple[float, float] | None) -> float:
    """``wanted_s`` moved into the brokers' bounds: a JoinGroup outside them is refused
    (INVALID_SESSION_TIMEOUT), and a worker that cannot join serves nothing."""
    if bounds is None:
        return wanted_s
    low, high = bounds
    return min(max(wanted_s, low), high)
