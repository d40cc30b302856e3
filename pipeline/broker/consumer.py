"""The worker's Kafka consumer: faust's aiokafka consumer with two changes, set by ``use_worker_consumer``.

**Fetch sizes.** faust fixes aiokafka's ``fetch_max_wait_ms`` at 1500 and leaves ``fetch_min_bytes`` at 1.
aiokafka keeps one fetch in flight per broker and leaves out of it the partitions whose fetched records are
still being handed on, so at tens of live legs a fetch that carries only idle partitions (the call-events
topic, a quiet audio partition) holds the broker's one slot for the full 1.5 s while frames queue on the
busy ones: finals waited seconds (P99 4.47 s at 23 calls on 2 cores, 1.64 s with the settings' 16 KB /
20 ms; the figures are in pipeline/config/worker.py). The consumer asks for at least ``min_bytes`` per
fetch, waiting at most ``max_wait_ms`` for them: at low load a frame waits at most that long.

**Seeking back to a commit of 0, or to none.** On a rebalance faust drops what it fetched but has not
handed to an agent yet (the agents' queues are cleared, records of paused partitions are skipped) and
relies on seeking every partition back to its committed offset (``perform_seek``) to read them again.
aiokafka's ``seek_to_committed`` seeks only where that offset is above 0: a partition committed at 0 (a
call open since the partition's first message, with no checkpoint yet) or not committed at all kept the
position after the dropped records, and those frames were never read: a worker that kept such a
partition through a rebalance lost the seconds of audio it had fetched (the chaos test, 2 runs of 8 on 2
busy cores). Here such a partition is sought to 0, or to its beginning (``auto_offset_reset`` earliest,
as a first read of it would do).

**Group coordination that died.** aiokafka runs the group membership (join, sync, heartbeats) in one
background task; when it raises, aiokafka logs it and the consumer goes on fetching nothing, for good.
``GroupCoordination(app).error`` is that task's exception, a health component: the worker exits and is
restarted instead of holding its partitions' calls silently (seen when a static member came back with
another web URL, which faust's assignor asserts on: see ``static_member_url``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiokafka
import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer
from faust.types import TP

FAUST_FETCH_MAX_WAIT_MS = 1500  # what faust passes aiokafka (faust/transport/drivers/aiokafka.py)


class WorkerConsumerThread(AIOKafkaConsumerThread):
    """faust's consumer thread, whose aiokafka consumer fetches with the sizes its consumer carries."""

    consumer: WorkerConsumer

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        client = super()._create_worker_consumer(transport)
        # faust passes no fetch_min_bytes and a fixed fetch_max_wait_ms; aiokafka reads both from these
        # attributes when it starts its fetcher (AIOKafkaConsumer.start), which happens after this.
        client._fetch_min_bytes = self.consumer.fetch_min_bytes
        client._fetch_max_wait_ms = self.consumer.fetch_max_wait_ms
        return client


class WorkerConsumer(Consumer):
    """faust's aiokafka consumer with fetch sizes of its own and a seek back that misses no partition."""

    fetch_min_bytes = 1
    fetch_max_wait_ms = FAUST_FETCH_MAX_WAIT_MS
    # The group's committed offsets as read by the last ``perform_seek`` (every rebalance): what others
    # committed on a partition before this worker got it, which its own commits do not tell it.
    committed_at_assignment: Mapping[TP, int] = {}

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return WorkerConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def perform_seek(self) -> None:
        """Every assigned partition back to its committed offset: also 0, and with none, its beginning."""
        committed = await self.seek_to_committed()  # seeks those above 0
        await self.seek_unsought(committed)
        self.committed_at_assignment = {tp: o for tp, o in committed.items() if o is not None and o >= 0}
        # faust's own bookkeeping, as its perform_seek keeps it: read from there on, committed there.
        self._read_offset.update({tp: o if o is not None and o > 0 else None for tp, o in committed.items()})
        self._committed_offset.update({tp: o for tp, o in committed.items() if o})

    async def seek_unsought(self, committed: Mapping[TP, int | None]) -> None:
        """Seek the partitions aiokafka's ``seek_to_committed`` left where they were (``committed``: its
        answer): committed at 0 to 0, never committed to their first offset."""
        zero = {tp: 0 for tp, offset in committed.items() if offset == 0}
        never = [tp for tp, offset in committed.items() if offset is None or offset < 0]
        # In the consumer's own thread, where aiokafka runs (faust's seek_to_committed runs there too).
        if zero:
            await self._thread.seek_wait(zero)
        if never:
            await self._thread.seek_to_beginning(*never)


def use_worker_consumer(app: faust.App, min_bytes: int, max_wait_ms: int) -> None:
    """Before the app starts: its consumer is a ``WorkerConsumer`` fetching at least ``min_bytes``, waiting
    at most ``max_wait_ms`` for them."""
    consumer_class = type("WorkerConsumer", (WorkerConsumer,),
                          {"fetch_min_bytes": min_bytes, "fetch_max_wait_ms": max_wait_ms})
    # The transport makes the app's consumer from its ``Consumer`` class (faust's Transport.create_consumer).
    app.transport.Consumer = consumer_class  # type: ignore[misc]


def static_member_url(instance_id: str) -> str:
    """faust's URL of a worker with static membership, named by its instance id, not its web address.

    A static member that comes back gets the assignment the group's leader made for its last life, and
    faust's assignor asserts that the URL in it is its own: a restart on another port or pod address
    killed its group coordination. The worker serves no faust tables, so nothing reaches it by this URL."""
    return f"http://callqa-worker/{quote(instance_id, safe='')}"


class GroupCoordination:
    """Health component: why the consumer's group coordination stopped (None while it runs)."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    @property
    def error(self) -> BaseException | None:
        # Read from the event loop while the task lives in the consumer's thread: done() and exception()
        # only read a finished task's state.
        # faust's ``app.consumer`` makes the consumer when there is none yet: a probe must not.
        thread = getattr(getattr(self.app, "_consumer", None), "_thread", None)
        client = getattr(thread, "_consumer", None)
        task = getattr(getattr(client, "_coordinator", None), "_coordination_task", None)
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()
