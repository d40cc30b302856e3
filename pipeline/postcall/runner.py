"""PostCallRunner: the finished calls' jobs, beside the worker's live work, at low priority: each call's redacted
recording (pipeline/recordings, with ``recordings`` on) and the post-call pass (with a post-call model).

Jobs come from ``topic_postcall`` (written by the worker that finished each call, see
``worker/call_outputs.py``) through a consumer group of their own (``<worker_id>.postcall``), so the
workers of one group share them and a job of a worker that died is taken by another. One job at a time:

1. read the call's audio back from the audio topic (``audio.py``);
1a. write its redacted recording: cuts checked by the live model through the live batcher (a few segments a
    call, the ones whose text was redacted), the file put where recordings are kept, its row written below;
2. decode its segments with the accurate model on an inference thread of the pass's own, at the OS nice
   value ``final_pass_nice``, a chunk at a time and only while the live batcher has at most
   ``final_pass_live_queue_max`` segments queued: live finals go first, and under load the jobs queue
   (``callqa_postcall_backlog``);
3. write the revision's rows (segments, QA events, QA result, calls row), flush the store, publish the
   revision's QA result and transcripts, and only then commit the job; with ``CALLQA_EXACTLY_ONCE``
   (the default) the publishing and the job's commit are one Kafka transaction
   (``ConsumedTransactions``), so a read_committed consumer sees a revision's results once, whoever
   redid the job.

Exactly once in the store: a worker killed mid-job leaves the job uncommitted, and whoever takes it next
writes the same rows (same keys and revision, times taken from the job) again, which the tables'
ReplacingMergeTree keeps once. A job whose audio has expired, or whose pass fails, is logged in one line,
counted, and committed: the live revision stays the call's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message

from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.broker.security import kafka_config
from pipeline.broker.transactions import ConsumedTransactions
from pipeline.config import Settings
from pipeline.contracts.messages import Message as ContractMessage
from pipeline.contracts.messages import PostCallJob, now_ms
from pipeline.contracts.serde import ContractError, Serde
from pipeline.postcall.audio import AudioGone, CallAudio, CallAudioError, read_call_audio
from pipeline.postcall.final_pass import PassOutcome, timed, transcribe_call
from pipeline.qa.call import QaConfig
from pipeline.recordings.writer import CallRecorder, RecordedCall, cut_seconds
from pipeline.segmentation import SpeechSegment
from pipeline.store.base import RowSink
from pipeline.worker.dead_letters import describe_error
from pipeline.worker.metrics import WorkerMetrics

log = logging.getLogger("callqa.postcall")

Publish = Callable[[str, str, ContractMessage], Awaitable[Awaitable[Any]]]  # topic, key, message -> delivery
LIVE_CHECK_S = 0.05  # how often a waiting pass looks at the live queue again
BACKLOG_EVERY_S = 5.0


@dataclass(frozen=True)
class JobOutcome:
    revision: PassOutcome | None  # the post-call pass's, when the job got one
    recording: RecordedCall | None  # None: recordings off, or this one failed (logged)


class PostCallRunner:
    def __init__(self, settings: Settings, final: Engine | None, front_end: Engine, live_queued: Callable[[], int],
                 publish: Publish, sink: RowSink, metrics: WorkerMetrics, config: QaConfig,
                 serde: Serde, recorder: CallRecorder | None = None) -> None:
        self.settings = settings
        self.final = final
        self.recorder = recorder
        self.front_end = front_end
        self.live_queued = live_queued
        self.publish = publish
        self.sink = sink
        self.metrics = metrics
        self.config = config
        self.serde = serde
        self._kafka = kafka_config(settings)  # librdkafka settings of the job consumer and the audio reads
        # Exactly once: a revision's messages and its job's commit in one transaction. The id is the worker's
        # instance id when it has one (its restart fences what it left open), else unique to the process.
        self._transactions = ConsumedTransactions(
            settings, f"{settings.worker_id}.postcall.{settings.worker_instance_id or uuid.uuid4().hex}",
            settings.transaction_timeout_s) if settings.exactly_once else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="postcall", initializer=self._low_priority)
        self._consumer: Consumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_hand: asyncio.Future[JobOutcome] | None = None  # the job being done, for close() to give up
        self._stopping = False
        self._backlog_at = 0.0
        self._backlog = JobBacklog()
        self._gone_said: set[tuple[str, int, str]] = set()  # (topic, partition, reason) of gone audio logged

    @property
    def error(self) -> BaseException | None:
        """Why the pass's loop stopped before ``close()`` (a bug: jobs would wait forever), or None."""
        task = self._task
        if task is None or not task.done() or self._stopping:
            return None
        return task.exception() if not task.cancelled() else RuntimeError("the post-call pass was cancelled")

    def start(self) -> None:
        self._consumer = Consumer({
            **self._kafka, "group.id": f"{self.settings.worker_id}.postcall", "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # One job can take minutes when live work keeps the pass waiting: that is not a dead member.
            "max.poll.interval.ms": 3_600_000,
        })
        self._consumer.subscribe([self.settings.topic_postcall])
        self._task = asyncio.create_task(self._run(), name="postcall-pass")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop now. A job in hand is given up: left uncommitted, the partition's next owner redoes it (its
        outcome was dropped once stopping anyway, and waiting for it held a worker's clean stop, and so its
        live calls' hand-over, for seconds: a recording's read-back and encoding). A step of it already on a
        thread runs out there, unawaited. The loop itself is let run out rather than cancelled, so no
        thread is still in the consumer's poll when it is closed; past ``timeout_s`` it is cancelled all
        the same."""
        self._stopping = True
        in_hand = self._in_hand if self._in_hand is not None and not self._in_hand.done() else None
        if in_hand is not None:
            in_hand.cancel()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            except Exception:  # noqa: BLE001, S110 - the loop's own failure was reported through ``error``
                pass
        if self._consumer is not None:
            await asyncio.to_thread(self._consumer.close)
        self._executor.shutdown(wait=in_hand is None, cancel_futures=True)

    async def _run(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while not self._stopping:
            # Short: a clean stop waits for the poll in progress before it closes the consumer.
            message = await asyncio.to_thread(consumer.poll, 0.2)
            await self._update_backlog(consumer)
            if message is None:
                continue
            if message.error() is not None:
                log.warning("post-call jobs: %s", message.error())
                continue
            await self._take(consumer, message)

    async def _take(self, consumer: Consumer, message: Message) -> None:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        try:
            job = self.serde.decode(message.value() or b"", PostCallJob)
        except ContractError as exc:
            log.warning("post-call job %s does not decode, skipped: %s", where, exc)
            await self._commit(consumer, message, where)
            return
        self._in_hand = asyncio.ensure_future(self.run_job(job))
        try:
            outcome = await self._in_hand
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._stopping and self._in_hand.cancelled() and not (current and current.cancelling()):
                return  # given up by close(): not stored, not committed; the partition's next owner redoes it
            raise
        except AudioGone as gone:
            self._skip_gone(job, gone, where)
        except Exception as exc:  # noqa: BLE001 - one job's failure is that job's: the live revision stays
            # A job that cannot be done (audio expired, a segment the model fails on, a job that makes no
            # sense) is skipped, not retried: retrying one that crashes would stop every worker in turn.
            log.warning("post-call job of call %s skipped (%s): %s", job.call_id, where, describe_error(exc))
            what = "no_audio" if isinstance(exc, CallAudioError) else "failed"
            if self._passes(job):
                self.metrics.postcall_calls.labels(what).inc()
            if self.recorder is not None:
                self.metrics.recordings.labels(what).inc()
        else:
            if self._stopping:
                return  # shutting down: not stored, not committed; the partition's next owner redoes it
            # Storing is not skipped on failure: a store that refuses fails the worker, and the job is redone.
            await self._store(job, outcome)
            if outcome.revision is not None:
                if self._transactions is not None:
                    await self._publish_and_commit(job, outcome.revision, consumer, message, where)
                    self._backlog_at = 0.0
                    return
                await self._publish(job, outcome.revision)
        await self._commit(consumer, message, where)
        self._backlog_at = 0.0

    def _skip_gone(self, job: PostCallJob, gone: AudioGone, where: str) -> None:
        """A job whose audio no longer exists is counted as ``no_audio`` and committed without a read. A deleted
        topic leaves a job for each of its calls: said once per topic, partition and reason, not once a job."""
        if self._passes(job):
            self.metrics.postcall_calls.labels("no_audio").inc()
        if self.recorder is not None:
            self.metrics.recordings.labels("no_audio").inc()
        said = (gone.topic, gone.partition, gone.reason)
        if said in self._gone_said:
            log.debug("post-call job of call %s skipped (%s): %s", job.call_id, where, gone)
            return
        self._gone_said.add(said)
        log.warning("post-call jobs whose audio is on %s[%d] are skipped (%s; first: call %s, %s): %s", gone.topic,
                    gone.partition, gone.reason, job.call_id, where, gone)

    def _passes(self, job: PostCallJob) -> bool:
        """Whether this job gets a post-call pass here: it names a model, and this worker has one."""
        return self.final is not None and bool(job.model)

    @staticmethod
    async def _commit(consumer: Consumer, message: Message, where: str) -> None:
        try:
            await asyncio.to_thread(commit, consumer, message)
        except KafkaException as exc:  # the partition moved meanwhile: its next owner redoes the job (same rows)
            log.info("post-call job %s not committed: %s", where, exc)

    async def run_job(self, job: PostCallJob) -> JobOutcome:
        """The call's recording and its next revision (CallAudioError when the topic no longer holds its
        frames). A recording that fails is logged and counted, and the pass goes on."""
        audio, read_cpu_s = await asyncio.to_thread(timed, read_call_audio, self._kafka, self.serde, job)
        self.metrics.postcall_read_bytes.labels("call").inc(audio.call_bytes)
        self.metrics.postcall_read_bytes.labels("other").inc(audio.other_bytes)
        self.metrics.postcall_cpu_seconds.inc(read_cpu_s)
        if not audio.legs:
            raise CallAudioError(f"call {job.call_id}: no frame of it on {job.audio_topic}[{job.audio_partition}]")
        recording = await self._record(job, audio)
        if not self._passes(job):
            return JobOutcome(None, recording)
        assert self.final is not None
        outcome = await transcribe_call(job, audio, self.front_end, self.final.model_label, self._decode,
                                        self.config, self.settings.final_pass_max_batch)
        self.metrics.postcall_audio_seconds.inc(sum(a.samples.size / a.sample_rate for a in audio.legs.values()))
        self.metrics.postcall_cpu_seconds.inc(outcome.segmenting_cpu_s)
        return JobOutcome(outcome, recording)

    async def _record(self, job: PostCallJob, audio: CallAudio) -> RecordedCall | None:
        if self.recorder is None:
            return None
        try:
            await self._live_room()  # its checks go through the live batcher: after the live work queued
            return await self.recorder.record(job, audio, self._executor)
        except Exception as exc:  # noqa: BLE001 - a recording that fails leaves the call's transcript as it is
            log.warning("recording of call %s not written: %s", job.call_id, describe_error(exc))
            self.metrics.recordings.labels("failed").inc()
            return None

    async def _decode(self, segments: Sequence[SpeechSegment]) -> list[TranscriptResult | Exception]:
        """A chunk of the call's segments, once live work leaves room, on the pass's own niced thread."""
        await self._live_room()
        loop = asyncio.get_running_loop()
        results, cpu_s = await loop.run_in_executor(self._executor, self._recognize, list(segments))
        self.metrics.postcall_cpu_seconds.inc(cpu_s)
        return results

    async def _live_room(self) -> None:
        """Until the live batcher has at most ``final_pass_live_queue_max`` segments queued (or the runner stops)."""
        while self.live_queued() > self.settings.final_pass_live_queue_max and not self._stopping:
            await asyncio.sleep(LIVE_CHECK_S)

    def _recognize(self, segments: list[SpeechSegment]) -> tuple[list[TranscriptResult | Exception], float]:
        assert self.final is not None
        started = time.thread_time()
        results = self.final.recognizer.recognize(segments)
        return results, time.thread_time() - started

    def _low_priority(self) -> None:
        """The pass's inference thread: named for the OS, and niced so live inference gets the cores first."""
        with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
            comm.write("postcall")
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.settings.final_pass_nice)

    async def _store(self, job: PostCallJob, outcome: JobOutcome) -> None:
        recording, revision = outcome.recording, outcome.revision
        if recording is not None:
            await self.sink.write("recordings", [recording.row(job)])
        if revision is not None:
            for table, table_rows in revision.rows.in_write_order():
                if table_rows:
                    await self.sink.write(table, table_rows)
        await self.sink.flush()
        if recording is not None:
            self.metrics.recordings.labels("written").inc()
            self.metrics.recording_bytes.inc(recording.size)
            for cut in recording.cuts:
                self.metrics.recording_cuts.labels(cut.how).inc()
            log.info("call %s: recording written (%d bytes, %d cuts, %.1f s silenced)", job.call_id, recording.size,
                     len(recording.cuts), cut_seconds(recording.cuts))
        if revision is None:
            return
        rows = revision.rows
        self.metrics.postcall_calls.labels("written").inc()
        self.metrics.postcall_delay.observe(max(0, now_ms() - job.requested_at_ms) / 1000)
        if rows.qa.score_pct != job.live_score_pct:
            self.metrics.postcall_changes.labels("score").inc()
        if rows.qa.auto_failed != job.live_auto_failed:
            self.metrics.postcall_changes.labels("auto_fail").inc()
        assert self.final is not None
        log.info("call %s: revision %d written by %s (score %.1f, live %.1f)", job.call_id, job.revision,
                 self.final.model_label, rows.qa.score_pct, job.live_score_pct)

    async def _publish(self, job: PostCallJob, outcome: PassOutcome) -> None:
        """The revision's transcripts and QA result (at-least-once: a job redone publishes them again)."""
        rows = outcome.rows
        deliveries = [await self.publish(self.settings.topic_transcripts, job.call_id, t) for t in rows.transcripts]
        deliveries.append(await self.publish(self.settings.topic_qa, job.call_id, rows.qa))
        await asyncio.gather(*deliveries)

    async def _publish_and_commit(self, job: PostCallJob, outcome: PassOutcome, consumer: Consumer,
                                  message: Message, where: str) -> None:
        """The revision's transcripts and QA result, and the job's commit, in one transaction."""
        assert self._transactions is not None
        rows, key = outcome.rows, job.call_id.encode()
        records = [(self.settings.topic_transcripts, key, self.serde.encode(t)) for t in rows.transcripts]
        records.append((self.settings.topic_qa, key, self.serde.encode(rows.qa)))
        try:
            await asyncio.to_thread(self._transactions.commit, records, consumer, message)
        except KafkaException as exc:  # the partition moved meanwhile: its next owner redoes the job (same rows)
            log.info("post-call job %s not committed: %s", where, exc)

    async def _update_backlog(self, consumer: Consumer) -> None:
        """Jobs on this worker's job partitions not committed yet (every few seconds: a broker round trip)."""
        if self._stopping or time.monotonic() - self._backlog_at < BACKLOG_EVERY_S:
            return
        self._backlog_at = time.monotonic()
        try:
            self.metrics.postcall_backlog.set(await asyncio.to_thread(self._backlog, consumer))
        except KafkaException as exc:  # a gauge: keep the last value; a broker hiccup must not stop the pass
            log.info("post-call backlog not read this time: %s", exc)


def commit(consumer: Consumer, message: Message) -> None:
    """Commit the job: the position after it, synchronously (the caller has made its rows durable)."""
    consumer.commit(message=message, asynchronous=False)


class JobBacklog:
    """Jobs on a consumer's partitions not taken yet, from what it knows locally: each partition's high
    watermark as its last fetch saw it, less its position (or, before it has taken a job there, the offset
    committed when the partition was assigned). Asking the brokers each time (committed offsets, then a
    watermark request per partition) took 1-3 s on a busy 2-core machine, and a worker's clean stop waited
    for the one in progress; now only a new assignment asks, once. A partition not fetched from yet, or
    with nothing committed and nothing taken, counts 0."""

    def __init__(self) -> None:
        self._assigned: frozenset[tuple[str, int]] = frozenset()
        self._committed: dict[tuple[str, int], int] = {}

    def __call__(self, consumer: Consumer) -> int:
        assigned = consumer.assignment()
        names = frozenset((tp.topic, tp.partition) for tp in assigned)
        if names != self._assigned:
            committed = consumer.committed(assigned, timeout=5.0) if assigned else []
            self._committed = {(tp.topic, tp.partition): tp.offset for tp in committed}
            self._assigned = names
        total = 0
        for tp in consumer.position(assigned):
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            at = tp.offset if tp.offset >= 0 else self._committed.get((tp.topic, tp.partition), -1)
            if high >= 0 and at >= 0:
                total += max(0, high - at)
        return total
