"""Kafka transactions per input partition: what the worker produces commits with the offsets it consumed.

Exactly once for a read_committed consumer of the output topics: the records a worker
produces for the calls of input partition p (transcripts, latency, alerts, QA results, post-call jobs,
dead letters, checkpoints) and the input offsets of p that they account for are committed in one
transaction. A worker that dies before that commit leaves an open transaction, which the next owner
of p aborts when it starts its producer for p: nothing of it is seen, and the next owner replays from
the offsets committed with the last transaction, together with the checkpoints of that transaction.

One transactional producer per input partition (Kafka's EOS v1 layout, as Kafka Streams had it before
KIP-447): the transactional id names the partition, so whoever takes p over fences its predecessor,
a worker that was paused past its session and wakes up cannot commit for p any more. aiokafka, which
faust uses, commits offsets in a transaction by group id only (no generation), so fencing by id is
what keeps such a zombie out.

``ConsumedTransactions`` is the same promise for a librdkafka consumer (the post-call pass): what one
message led to is produced and that message's offset committed in one transaction; librdkafka sends the
group's generation with the offsets (KIP-447), so one producer per process is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition as KafkaTopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from pipeline.broker.security import aiokafka_security, kafka_config
from pipeline.config.broker import BrokerSettings

log = logging.getLogger("callqa.kafka.transactions")


class TransactionError(RuntimeError):
    """A partition's transaction could not be committed (fenced by a new owner, broker refused): what it
    produced since its last commit is aborted, and the next owner replays it."""


class PartitionTransactions:
    """Transactional producers of the input partitions this worker owns, by partition number.

    ``send`` puts a record in partition p's open transaction (opening one if none); ``commit`` commits
    each partition's transaction with its input offsets. A send waits while its partition commits.
    """

    def __init__(self, settings: BrokerSettings, group_id: str, transaction_timeout_s: float,
                 owned: Callable[[int], bool] = lambda partition: False) -> None:
        self.settings = settings
        self.group_id = group_id
        self.transaction_timeout_ms = round(transaction_timeout_s * 1000)
        # Whether the consumer holds input partition p now: a record for p may come before ``assign`` has
        # started p's producer (faust hands out frames of a new partition while its assignment is handled).
        self.owned = owned
        self._producers: dict[int, AIOKafkaProducer] = {}
        self._starting: dict[int, asyncio.Task[None]] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._open: set[int] = set()  # partitions with a transaction begun and not yet ended
        self.commits = 0
        self.aborts = 0

    def transactional_id(self, partition: int) -> str:
        return f"{self.group_id}.in-{partition}"

    @property
    def partitions(self) -> set[int]:
        return set(self._producers)

    async def assign(self, partitions: set[int]) -> None:
        """Own exactly ``partitions``: start a producer for each new one (its start fences the partition's
        previous owner and aborts what that one left open), stop the others (aborting their open work)."""
        gone = set(self._producers) - partitions
        await asyncio.gather(*(self._stop(p) for p in gone))
        new = sorted(partitions)
        started = await asyncio.gather(*(self._started(p) for p in new), return_exceptions=True)
        failed = [(p, e) for p, e in zip(new, started, strict=True) if isinstance(e, BaseException)]
        if failed:
            p, exc = failed[0]
            raise TransactionError(f"transactional producer {self.transactional_id(p)} did not start: "
                                   f"{type(exc).__name__}: {exc}")

    async def _started(self, partition: int) -> None:
        """Partition ``partition``'s producer, started once (by ``assign`` or by its first record)."""
        if partition in self._producers:
            return
        task = self._starting.get(partition)
        if task is None:
            task = self._starting[partition] = asyncio.create_task(self._start(partition))
            task.add_done_callback(lambda _: self._starting.pop(partition, None))
        await asyncio.shield(task)

    async def _start(self, partition: int) -> None:
        producer = _errors_seen(AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap, transactional_id=self.transactional_id(partition),
            enable_idempotence=True, acks="all", linger_ms=5, compression_type="lz4",
            transaction_timeout_ms=self.transaction_timeout_ms, **aiokafka_security(self.settings)))
        await producer.start()  # InitProducerId: fences the id's previous holder, aborts its open transaction
        self._producers[partition] = producer
        self._locks[partition] = asyncio.Lock()

    async def _stop(self, partition: int) -> None:
        producer = self._producers.pop(partition)
        lock = self._locks.pop(partition)
        async with lock:
            if partition in self._open:
                self._open.discard(partition)
                # Not committed: its records are dropped and the next owner replays their input. Fenced
                # already (the next owner started) is the same outcome; aiokafka then refuses the abort with
                # an AssertionError (FATAL_ERROR -> ABORTING), which once ended a SIGTERM'd worker's shutdown
                # with the other producers unstopped, and the process hung until SIGKILL.
                with contextlib.suppress(KafkaError, asyncio.TimeoutError, AssertionError):
                    await asyncio.wait_for(producer.abort_transaction(), 10.0)
                self.aborts += 1
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(producer.stop(), 10.0)

    async def send(self, partition: int, topic: str, key: bytes | None, value: bytes | None,
                   to_partition: int | None = None) -> Awaitable[Any]:
        """Put a record in input partition ``partition``'s transaction; returns its delivery future (the
        record is written, not yet committed, when it resolves)."""
        if partition not in self._producers:
            # Starting, or assigned and not started yet: wait for it. Not owned: never start one, which would
            # fence the partition's real owner.
            if partition not in self._starting and not self.owned(partition):
                raise TransactionError(f"input partition {partition} is not owned here: no transaction to send "
                                       f"{topic} records in")
            await self._started(partition)
        producer = self._producers[partition]
        async with self._locks[partition]:
            if partition not in self._open:
                await producer.begin_transaction()
                self._open.add(partition)
            fut: Awaitable[Any] = await producer.send(topic, value=value, key=key, partition=to_partition)
        return fut

    async def commit(self, offsets: dict[int, dict[tuple[str, int], int]]) -> None:
        """Commit each owned partition's transaction with its input offsets (``{partition: {(topic,
        partition): next offset}}``); a partition with neither records nor offsets is left alone.
        Raises TransactionError naming the first partition that failed (after trying all)."""
        parts = (set(offsets) | self._open) & set(self._producers)
        results = await asyncio.gather(*(self._commit(p, offsets.get(p, {})) for p in sorted(parts)),
                                       return_exceptions=True)
        for p, result in zip(sorted(parts), results, strict=True):
            if isinstance(result, BaseException):
                raise TransactionError(f"transaction {self.transactional_id(p)} not committed: "
                                       f"{type(result).__name__}: {result}") from result

    async def _commit(self, partition: int, offsets: dict[tuple[str, int], int]) -> None:
        producer = self._producers[partition]
        async with self._locks[partition]:
            if not offsets and partition not in self._open:
                return
            if partition not in self._open:
                await producer.begin_transaction()
                self._open.add(partition)
            try:
                if offsets:
                    await producer.send_offsets_to_transaction(
                        {KafkaTopicPartition(t, p): o for (t, p), o in offsets.items()}, self.group_id)
                await producer.commit_transaction()
            finally:
                # Ended either way: a failed commit leaves the producer in an error state, and the worker
                # stops (the next owner aborts what was left and replays it).
                self._open.discard(partition)
            self.commits += 1

    async def close(self) -> None:
        """Abort what is open (a read_committed consumer is not held up until the next owner starts) and
        stop every producer."""
        results = await asyncio.gather(*(self._stop(p) for p in list(self._producers)), return_exceptions=True)
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.warning("a transactional producer did not stop cleanly: %s", failure)


def _errors_seen(producer: AIOKafkaProducer) -> AIOKafkaProducer:
    """``producer`` with the errors of a fenced (or failed) transaction marked as seen where aiokafka leaves
    them unread: on each unsent batch's drain future (read only by a flush) and on the transaction-end future
    (read only by a commit or abort in progress, and replaced by the next error or abort). When this worker
    gives a partition up and its next owner fences it, nothing reads them, and asyncio logged "Future
    exception was never retrieved" with a ProducerFenced traceback as an ERROR at exit after an ordinary
    hand-over (the scale-out test, which checks worker logs for tracebacks, failed so on a busy machine).
    Marking an error seen changes nothing for a caller that awaits it: it still gets the error."""
    manager = getattr(producer, "_txn_manager", None)
    accumulator = getattr(producer, "_message_accumulator", None)
    if manager is None or accumulator is None:
        return producer
    fail_all, fatal_error, error_transaction = accumulator.fail_all, manager.fatal_error, manager.error_transaction

    def batches_failed(exc: BaseException) -> None:
        batches = [b for queue in accumulator._batches.values() for b in queue] + list(accumulator._pending_batches)
        fail_all(exc)
        for batch in batches:
            _seen(batch._drain_waiter)

    def transaction_failed(fail: Any) -> Any:
        def failed(exc: BaseException) -> None:
            fail(exc)
            _seen(manager._transaction_waiter)
        return failed

    accumulator.fail_all = batches_failed
    manager.fatal_error, manager.error_transaction = transaction_failed(fatal_error), transaction_failed(error_transaction)
    return producer


def _seen(future: Any) -> None:
    if isinstance(future, asyncio.Future) and future.done() and not future.cancelled():
        future.exception()


class ConsumedTransactions:
    """Commits what a consumed message led to together with its offset (librdkafka, KIP-447)."""

    def __init__(self, settings: BrokerSettings, transactional_id: str, transaction_timeout_s: float) -> None:
        self.transactional_id = transactional_id
        self._producer = Producer({
            **kafka_config(settings), "transactional.id": transactional_id, "enable.idempotence": True,
            "acks": "all", "linger.ms": 5, "transaction.timeout.ms": round(transaction_timeout_s * 1000),
            # The Java client's (and aiokafka's) key hash: a call's revision lands on the partition of its
            # live results, after them (librdkafka's default, crc32, put it on another partition).
            "partitioner": "murmur2_random"})
        self._ready = False

    def commit(self, records: list[tuple[str, bytes, bytes]], consumer: Consumer, message: KafkaMessage,
               timeout_s: float = 60.0) -> None:
        """Produce ``records`` (topic, key, value) and commit the position after ``message`` for
        ``consumer``'s group, all or nothing (blocking). Raises KafkaException when the broker refuses,
        e.g. the group moved the partition meanwhile: nothing of it is visible then."""
        if not self._ready:  # fences an earlier process with this id and aborts what it left open
            self._producer.init_transactions(timeout_s)
            self._ready = True
        self._producer.begin_transaction()
        try:
            for topic, key, value in records:
                self._producer.produce(topic, value=value, key=key)
                self._producer.poll(0)
            position = TopicPartition(message.topic() or "", message.partition() or 0, (message.offset() or 0) + 1)
            self._producer.send_offsets_to_transaction([position], consumer.consumer_group_metadata(), timeout_s)
            self._producer.commit_transaction(timeout_s)
        except Exception:
            with contextlib.suppress(Exception):
                self._producer.abort_transaction(timeout_s)
            raise
