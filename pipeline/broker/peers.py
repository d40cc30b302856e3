"""Workers that watch each other's processes, so a dead one leaves the group at once.

A consumer group only notices a worker killed with SIGKILL (an OOM kill, a crash) when its session
expires, 15 s by default, and every call on its partitions waits that long. A session much shorter than
that costs a rebalance each time a host stalls, and brokers refuse one under 6 s by default. Instead each
worker holds a TCP connection to every other worker's *liveness listener*: the operating system closes a
process's sockets the moment it dies, whatever killed it, while a process that is only slow or paused
keeps them open. A closed connection is therefore proof of death, and the watcher then sends the group
coordinator a LeaveGroup on the dead member's behalf: the group rebalances at the survivors' next
heartbeat instead of at session expiry. A host that vanishes (power, network) closes nothing: that still
waits for the session timeout.

Peers find each other through the group itself: a worker's Kafka client id names its listener's port and
a nonce (``<worker_id>.live.<port>.<nonce>``), and the coordinator reports each member's client id and the
address it connects from. On connecting, the listener sends that client id back, so a port reused by
another process after a restart is not mistaken for the member it used to belong to.

A static member (group.instance.id) is the exception: the coordinator keeps the client id of the instance's
first process for as long as the member stays in the group (a rejoin under the instance id replaces only its
member id), so a successor under a new client id could never be found by its peers, and one killed after a
restart waited out its session. Every process of an instance therefore uses one client id: the nonce comes
from the instance id (``instance_nonce``) and the port is the one its predecessor listened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DescribeGroupsRequest
from aiokafka.protocol.group import LeaveGroupRequest

from pipeline.broker.security import aiokafka_security
from pipeline.config.broker import BrokerSettings

log = logging.getLogger(__name__)

# A listener holds at most this many connections: one per peer, so far more than any group of workers;
# beyond it new connections are closed at once (a stranger cannot take all of the process's descriptors).
MAX_HELD = 512
# How long a connect, and then the listener's greeting, may take before the member is left to its session.
CONNECT_TIMEOUT_S = 2.0
# A member whose listener could not be reached (or answered as someone else) is tried again after this long.
RETRY_S = 10.0
# How long an eviction is retried while the coordinator answers with a retriable error (loading the group
# after a broker restart, moving), and the pause between tries.
EVICT_RETRY_S = 20.0
EVICT_RETRY_PAUSE_S = 0.5
# What a worker that stops cleanly writes to the peers watching it, just before its sockets close.
GOODBYE = b"goodbye\n"
# What a worker's log says of each peer it evicted (benchmarks count these lines).
EVICTED = "evicted from group"
_CLIENT_ID = re.compile(r"^(?P<worker>.+)\.live\.(?P<port>\d{1,5})\.(?P<nonce>[0-9a-f]{8,32})$")


@dataclass(frozen=True)
class PeerIdentity:
    """This worker's Kafka client id, which tells its peers where its liveness listener is."""

    worker_id: str
    port: int
    nonce: str

    @property
    def client_id(self) -> str:
        return f"{self.worker_id}.live.{self.port}.{self.nonce}"

    @classmethod
    def parse(cls, client_id: str) -> PeerIdentity | None:
        """The identity a client id carries; None for a client that is not a watched worker."""
        match = _CLIENT_ID.match(client_id)
        if match is None or not 0 < int(match["port"]) < 65536:
            return None
        return cls(match["worker"], int(match["port"]), match["nonce"])


def instance_nonce(group_id: str, instance_id: str) -> str:
    """The nonce every process of a static member uses, so the client id the coordinator keeps stays its own."""
    return hashlib.sha256(f"{group_id}\0{instance_id}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Member:
    """One member of the group as its coordinator describes it."""

    member_id: str
    client_id: str
    host: str  # the address the coordinator saw it connect from


class LivenessListener:
    """A TCP listener that only holds connections open: its peers learn this process died when they close.

    Bound at once (the port goes into the worker's client id before its consumer exists); it greets each
    connection with that client id (one line) once its watch's loop runs, and reads nothing that matters."""

    def __init__(self, host: str, port: int, worker_id: str, nonce: str = "") -> None:
        """``nonce``: empty for a process of its own (a random one); ``instance_nonce`` for a static member."""
        self.socket = socket.create_server((host, port), backlog=64)
        self.socket.setblocking(False)
        self.identity = PeerIdentity(worker_id, self.socket.getsockname()[1], nonce or secrets.token_hex(8))
        self.held: set[asyncio.StreamWriter] = set()
        self.leaving = False

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._hold, sock=self.socket)

    async def goodbye(self) -> None:
        self.leaving = True  # a peer that connects from now on hears it at once
        for writer in list(self.held):
            with contextlib.suppress(OSError):
                writer.write(GOODBYE)
                await writer.drain()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.held) >= MAX_HELD:
            writer.close()
            return
        self.held.add(writer)
        try:
            writer.write(f"{self.identity.client_id}\n".encode() + (GOODBYE if self.leaving else b""))
            while await reader.read(256):  # until the peer closes (it never writes)
                pass
        except OSError:
            pass
        finally:
            self.held.discard(writer)
            writer.close()


class PeerWatch:
    """Holds a connection to every other member's listener and evicts a member whose connection closes.

    One asyncio loop on a thread of its own serves this worker's listener and watches its peers, so a
    greeting is never late behind the worker's own event loop. Several survivors may evict the same member:
    the coordinator answers the later ones UNKNOWN_MEMBER_ID, harmlessly. ``on_evicted`` gets the dead
    peer's client id and the member ids this watch removed (for a metric)."""

    def __init__(self, settings: BrokerSettings, group_id: str, listener: LivenessListener, poll_s: float = 1.0,
                 on_evicted: Callable[[str, list[str]], None] = lambda client_id, removed: None) -> None:
        self.settings, self.group_id, self.listener, self.poll_s = settings, group_id, listener, poll_s
        self.on_evicted = on_evicted
        self.watched: dict[str, set[str]] = {}  # client id -> its member ids, while its connection is open
        self.tasks: dict[str, asyncio.Task[None]] = {}  # client id -> the task connecting to or watching it
        self.retry_at: dict[str, float] = {}  # members not reachable: when to try again
        self.client: AIOKafkaClient | None = None
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(self._run()), name="peer-watch",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def say_goodbye(self, timeout_s: float = 1.0) -> None:
        """Tell every peer watching this worker that it stops cleanly, so none evicts it when its sockets close:
        a dynamic member has left the group itself, and a static one keeps its partitions until it is back
        (or its session expires). Called once the consumer has stopped; a kill never gets here."""
        if self.thread.is_alive():
            with contextlib.suppress(Exception):  # stopping anyway: the peers then evict a member already gone
                asyncio.run_coroutine_threadsafe(self.listener.goodbye(), self.loop).result(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopping.set)
            self.thread.join(timeout_s)
        self.listener.socket.close()

    async def _run(self) -> None:
        server = await self.listener.serve()
        client = AIOKafkaClient(bootstrap_servers=self.settings.bootstrap, client_id=f"{self.group_id}.peer-watch",
                                request_timeout_ms=5000, **aiokafka_security(self.settings))
        self.client = client
        try:
            while not self.stopping.is_set():
                members = await self._members(client)
                if members is not None:
                    self.refresh(members)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.poll_s)
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            server.close()
            for writer in list(self.listener.held):
                writer.close()
            await client.close()

    async def _members(self, client: AIOKafkaClient) -> list[Member] | None:
        """The group's members now (None if the brokers did not answer: the next poll asks again)."""
        try:
            if not client.cluster.brokers():
                await client.bootstrap()
            node = await client.coordinator_lookup(CoordinationType.GROUP, self.group_id)
            response = await client.send(node, DescribeGroupsRequest([self.group_id]))
        except Exception as exc:  # noqa: BLE001 - broker restarting, coordinator moving: ask again
            log.debug("listing group %s: %s", self.group_id, exc)
            return None
        group = response.groups[0]
        if group[0] != 0:  # error code: the coordinator is loading or moved
            return None
        # The coordinator writes the host as InetAddress.toString(): "/10.0.0.7" or "name/10.0.0.7".
        return [Member(m[0], m[1], m[2].rpartition("/")[2]) for m in group[5]]

    def refresh(self, members: list[Member]) -> None:
        """Watch the group's other workers as the coordinator lists them now."""
        own = self.listener.identity.client_id
        listed: dict[str, set[str]] = {}
        hosts: dict[str, str] = {}
        for member in members:
            if member.client_id != own and PeerIdentity.parse(member.client_id):
                listed.setdefault(member.client_id, set()).add(member.member_id)
                hosts[member.client_id] = member.host
        for client_id in set(self.tasks) - set(listed):  # gone from the group: nothing to watch
            self.tasks.pop(client_id).cancel()
            self.watched.pop(client_id, None)
        for client_id in set(self.retry_at) - set(listed):
            del self.retry_at[client_id]
        for client_id, member_ids in listed.items():
            if client_id in self.watched:
                self.watched[client_id] = member_ids
            elif client_id not in self.tasks and self.retry_at.get(client_id, 0.0) <= time.monotonic():
                self.tasks[client_id] = asyncio.create_task(self._watch(client_id, hosts[client_id], member_ids))

    async def _watch(self, client_id: str, host: str, member_ids: set[str]) -> None:
        try:
            if await self._until_closed(client_id, host, member_ids) and not self.stopping.is_set():
                await self._evict(client_id, self.watched.pop(client_id))
        finally:
            self.tasks.pop(client_id, None)
            self.watched.pop(client_id, None)

    async def _until_closed(self, client_id: str, host: str, member_ids: set[str]) -> bool:
        """Whether the member's listener greeted as itself and then closed (False: not reached)."""
        identity = PeerIdentity.parse(client_id)
        assert identity is not None
        where = f"{host}:{identity.port}"
        # Only a connection that greeted with the member's own client id and then closed proves a death:
        # a refused or foreign port may be an address the coordinator saw through a NAT or proxy, and
        # evicting a live member for it would rebalance the group at every poll.
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, identity.port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self._not_watched(client_id, f"{where}: {exc or type(exc).__name__}")
            return False
        try:
            line = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT_S)
            if line.decode(errors="replace").strip() != client_id:
                self._not_watched(client_id, f"{where} answers as {line[:80]!r}")
                return False
            self.watched[client_id] = member_ids
            said = b""
            with contextlib.suppress(OSError):  # a reset is a close too
                while chunk := await reader.read(256):
                    said = (said + chunk)[-64:]
            if GOODBYE in said:  # a clean stop: it left by itself, or (static) is coming back as itself
                log.info("group member %s stopped cleanly", client_id)
                return False
            return client_id in self.watched
        except (OSError, TimeoutError) as exc:
            self._not_watched(client_id, f"{where}: {exc or type(exc).__name__}")
            return False
        finally:
            writer.close()

    def _not_watched(self, client_id: str, why: str) -> None:
        """Left to its session timeout for now; asked again after a while, not at every poll."""
        log.info("group member %s not watched (%s); trying again in %.0f s", client_id, why, RETRY_S)
        self.retry_at[client_id] = time.monotonic() + RETRY_S

    async def _evict(self, client_id: str, member_ids: set[str]) -> None:
        """LeaveGroup for each of the dead member's ids, retried for ``EVICT_RETRY_S`` while the coordinator
        answers with a retriable error: a member killed just as a restarted broker came back was answered
        COORDINATOR_LOAD_IN_PROGRESS once and then left to its session timeout (the chaos test's second kill)."""
        removed: list[str] = []
        pending = set(member_ids)
        deadline = time.monotonic() + EVICT_RETRY_S
        while pending:
            try:
                await self._leave(pending, removed, retry=time.monotonic() < deadline)
            except Exception as exc:  # noqa: BLE001 - the member's session expiry still removes it
                if time.monotonic() >= deadline:
                    log.warning("group member %s died; evicting it from group %s failed: %s", client_id,
                                self.group_id, exc)
                    return
            if pending:
                await asyncio.sleep(EVICT_RETRY_PAUSE_S)
        if removed:
            log.warning("group member %s died (its liveness connection closed): %s %s", client_id, EVICTED,
                        self.group_id)
        self.on_evicted(client_id, removed)

    async def _leave(self, pending: set[str], removed: list[str], retry: bool) -> None:
        """One LeaveGroup per member id in ``pending``; an id leaves ``pending`` once answered for good (removed,
        or UNKNOWN_MEMBER_ID: another survivor, or its own clean shutdown, was first), or on any error when
        ``retry`` is off."""
        assert self.client is not None
        node = await self.client.coordinator_lookup(CoordinationType.GROUP, self.group_id)
        for member_id in sorted(pending):
            response = await self.client.send(node, LeaveGroupRequest(self.group_id, member_id))
            error = for_code(response.error_code) if response.error_code else None
            if error is None:
                removed.append(member_id)
            elif retry and error.retriable:
                continue
            else:
                log.info("LeaveGroup for %s: %s", member_id, error.__name__)
            pending.discard(member_id)
