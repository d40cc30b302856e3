"""Workers evict a peer from their group when its process dies (pipeline/broker/peers.py).

The peer is a real process in a real consumer group whose session is 60 s: if the group loses it well
before that, only the eviction can have removed it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.broker.local import free_port
from pipeline.broker.peers import LivenessListener, Member, PeerIdentity, PeerWatch

# The peer: a liveness listener served by its own watch, and a consumer of the group under the listener's
# client id, with a session far longer than the test waits.
PEER = """
import os, signal, sys, time
from confluent_kafka import Consumer
from pipeline.broker.peers import LivenessListener, PeerWatch, instance_nonce
from pipeline.config import Settings
bootstrap, group, topic = sys.argv[1:4]
# A static member: its instance id and the port each of its processes listens on.
instance, port = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else ("", 0)
listener = LivenessListener("127.0.0.1", port, "peer", instance_nonce(group, instance) if instance else "")
watch = PeerWatch(Settings(bootstrap_servers=bootstrap), group, listener, 0.5)
watch.start()
# A clean stop that does not leave the group, as a static member's: goodbye, then exit.
signal.signal(signal.SIGTERM, lambda *_: (watch.say_goodbye(), os._exit(0)))
static = {"group.instance.id": instance} if instance else {}
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": listener.identity.client_id,
                     "session.timeout.ms": 60000, "heartbeat.interval.ms": 1000, **static})
consumer.subscribe([topic])
said = False
while True:
    consumer.poll(0.2)
    if consumer.assignment() and not said:
        print(listener.identity.client_id, flush=True)
        said = True
"""


def test_a_client_id_names_the_listener_and_foreign_ones_are_not_peers() -> None:
    identity = PeerIdentity("callqa-worker", 40123, "0123abcd0123abcd")
    assert PeerIdentity.parse(identity.client_id) == identity
    assert PeerIdentity.parse("faust-0.11.3") is None
    assert PeerIdentity.parse("callqa-worker.live.0.0123abcd") is None  # no port 0
    assert PeerIdentity.parse("callqa-worker.live.99999.0123abcd") is None


def _until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.1)


def _start_peer(settings, group: str, log, *static: str) -> tuple[subprocess.Popen[str], str]:  # type: ignore[no-untyped-def]
    """The peer process and its client id once it holds partitions; ``static``: its instance id and port."""
    peer = subprocess.Popen([sys.executable, "-c", PEER, settings.bootstrap, group, settings.topic_audio, *static],
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=Path(__file__).parents[2])
    assert peer.stdout is not None
    peer_id = peer.stdout.readline().strip()  # once its consumer holds partitions
    assert PeerIdentity.parse(peer_id), f"the peer did not join: {peer_id!r}, see {log.name}"
    return peer, peer_id


def _members(admin, group: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10)
    return [(m.client_id, m.member_id) for m in desc.members]


@dataclass
class Group:
    """A real peer process in a group of its own, and this process's watch over it (not started)."""

    admin: Any
    name: str
    peer: subprocess.Popen[str]
    peer_id: str
    watch: PeerWatch
    evicted: list[tuple[str, list[str]]]


@pytest.fixture
def group(kafka_settings, tmp_path: Path) -> Iterator[Group]:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    name = f"{kafka_settings.worker_id}.peers"
    evicted: list[tuple[str, list[str]]] = []
    with (tmp_path / "peer.log").open("w") as log:
        peer, peer_id = _start_peer(kafka_settings, name, log)
        watch = PeerWatch(kafka_settings, name, LivenessListener("127.0.0.1", 0, "survivor"), poll_s=0.5,
                          on_evicted=lambda client_id, removed: evicted.append((client_id, removed)))
        try:
            yield Group(AdminClient({"bootstrap.servers": kafka_settings.bootstrap}), name, peer, peer_id, watch,
                        evicted)
        finally:
            if peer.poll() is None:
                peer.kill()
            watch.close()


@pytest.mark.broker
def test_a_killed_peer_is_evicted_and_a_paused_one_is_not(group: Group) -> None:
    group.watch.start()
    _until(lambda: group.peer_id in group.watch.watched, 30, f"the watch connects to {group.peer_id}")

    os.kill(group.peer.pid, signal.SIGSTOP)  # a stalled process keeps its sockets: it is not evicted
    time.sleep(3)
    os.kill(group.peer.pid, signal.SIGCONT)
    members = _members(group.admin, group.name)
    assert group.evicted == [] and [client_id for client_id, _ in members] == [group.peer_id]

    group.peer.kill()  # SIGKILL: no LeaveGroup of its own
    group.peer.wait()
    # Gone from the group well inside its 60 s session: the eviction did it.
    _until(lambda: _members(group.admin, group.name) == [], 30, "the killed peer leaves the group")
    _until(lambda: group.evicted != [], 10, "the watch reports the eviction")  # it hears back after the group changed
    assert group.evicted == [(group.peer_id, [member_id for _, member_id in members])]
    assert group.peer_id not in group.watch.watched


@pytest.mark.broker
def test_a_peer_that_says_goodbye_is_not_evicted(group: Group) -> None:
    """A clean stop (a static member restarting keeps its partitions until it is back) is not a death."""
    group.watch.start()
    _until(lambda: group.peer_id in group.watch.watched, 30, f"the watch connects to {group.peer_id}")
    group.peer.terminate()
    assert group.peer.wait(10) == 0
    _until(lambda: group.peer_id not in group.watch.watched, 10, "the watch sees the connection close")
    time.sleep(2)
    assert group.evicted == [] and [c for c, _ in _members(group.admin, group.name)] == [group.peer_id]  # its session


def test_only_a_greeted_connection_that_closes_counts_as_a_death(kafka_settings) -> None:  # type: ignore[no-untyped-def]
    """A refused port or one that answers as someone else (an address seen through a NAT, a port another
    process took) is no proof: the member is left to its session, and not tried again at every poll."""
    evicted: list[str] = []
    watch = PeerWatch(kafka_settings, "g", LivenessListener("127.0.0.1", 0, "me"),
                      on_evicted=lambda client_id, removed: evicted.append(client_id))
    stranger = socket.create_server(("127.0.0.1", 0))
    refused = socket.create_server(("127.0.0.1", 0))
    refused_port = refused.getsockname()[1]
    refused.close()

    def greet_as_someone_else() -> None:
        conn, _ = stranger.accept()
        conn.sendall(b"other.live.1234.0123abcd\n")
        time.sleep(0.5)
        conn.close()

    threading.Thread(target=greet_as_someone_else, daemon=True).start()
    foreign = PeerIdentity("w", stranger.getsockname()[1], "aaaabbbb").client_id
    gone = PeerIdentity("w", refused_port, "ccccdddd").client_id

    async def watch_both() -> None:
        watch.refresh([Member("m1", foreign, "127.0.0.1"), Member("m2", gone, "127.0.0.1")])
        await asyncio.gather(*watch.tasks.values())
        watch.refresh([Member("m1", foreign, "127.0.0.1"), Member("m2", gone, "127.0.0.1")])
        assert watch.tasks == {}  # within the retry delay: not even tried

    try:
        asyncio.run(watch_both())
        assert evicted == [] and watch.watched == {}
        assert set(watch.retry_at) == {foreign, gone}
    finally:
        stranger.close()
        watch.close()


class LoadingCoordinator:
    """A coordinator's answers to LeaveGroup as a broker just restarted gives them: COORDINATOR_LOAD_IN_PROGRESS
    (14) ``loading`` times, then ``final`` (a broker cannot be made to load its groups on demand)."""

    def __init__(self, loading: int, final: int) -> None:
        self.answers = [14] * loading + [final]
        self.sent: list[str] = []

    async def coordinator_lookup(self, kind: Any, group: str) -> int:
        return 0

    async def send(self, node: int, request: Any) -> Any:
        self.sent.append(request._member_id)
        return type("LeaveGroupResponse", (), {"error_code": self.answers.pop(0) if len(self.answers) > 1
                                                 else self.answers[0]})()


@pytest.mark.parametrize(("final", "removed"), [(0, ["m1"]), (25, [])])
def test_an_eviction_is_retried_while_the_coordinator_loads_the_group(
    kafka_settings, monkeypatch: pytest.MonkeyPatch, final: int, removed: list[str],  # type: ignore[no-untyped-def]
) -> None:
    """A peer killed just as a restarted broker came back: its LeaveGroup was answered 'loading' once and the
    member left to its 60 s session (the chaos test's second kill). Retried now until a final answer: removed
    (0), or already gone (UNKNOWN_MEMBER_ID, 25: not retried, nothing removed)."""
    monkeypatch.setattr("pipeline.broker.peers.EVICT_RETRY_PAUSE_S", 0.01)
    evicted: list[tuple[str, list[str]]] = []
    watch = PeerWatch(kafka_settings, "g", LivenessListener("127.0.0.1", 0, "me"),
                      on_evicted=lambda client_id, ids: evicted.append((client_id, ids)))
    coordinator = LoadingCoordinator(loading=3, final=final)
    watch.client = coordinator  # type: ignore[assignment]
    try:
        asyncio.run(watch._evict("dead.live.1.0123abcd", {"m1"}))
    finally:
        watch.close()
    assert coordinator.sent == ["m1"] * 4
    assert evicted == [("dead.live.1.0123abcd", removed)]


@pytest.mark.broker
def test_a_static_members_successor_is_watched_and_evicted_under_the_client_id_its_group_keeps(
        kafka_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The coordinator keeps a static member's first client id across its restarts: a successor under a new
    one was never found by its peers, and a kill -9 after a restart waited out the session."""
    from confluent_kafka.admin import AdminClient

    name = f"{kafka_settings.worker_id}.static"
    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap})
    evicted: list[tuple[str, list[str]]] = []
    watch = PeerWatch(kafka_settings, name, LivenessListener("127.0.0.1", 0, "survivor"), poll_s=0.5,
                      on_evicted=lambda client_id, removed: evicted.append((client_id, removed)))
    static = ("peer-1", str(free_port()))
    with (tmp_path / "peer.log").open("w") as log:
        first, first_id = _start_peer(kafka_settings, name, log, *static)
        second = None
        try:
            watch.start()
            _until(lambda: first_id in watch.watched, 30, f"the watch connects to {first_id}")
            first.terminate()  # a clean stop: goodbye, and no LeaveGroup (a static member keeps its place)
            assert first.wait(10) == 0
            second, second_id = _start_peer(kafka_settings, name, log, *static)
            assert second_id == first_id
            assert [client_id for client_id, _ in _members(admin, name)] == [first_id]
            assert evicted == []
            _until(lambda: second_id in watch.watched, 30, "the watch connects to the successor")
            second.kill()  # SIGKILL
            second.wait()
            _until(lambda: _members(admin, name) == [], 30, "the killed successor leaves the group (session: 60 s)")
            _until(lambda: evicted != [], 10, "the watch reports the eviction")
            assert [client_id for client_id, _ in evicted] == [first_id]
        finally:
            for peer in (first, second):
                if peer is not None and peer.poll() is None:
                    peer.kill()
            watch.close()
