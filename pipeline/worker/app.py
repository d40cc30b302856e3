"""The faust app: a thin shell that feeds ``CallProcessor`` and commits what it allows.

- two agents, one per input topic (audio frames, call events); both topics have the same partition
  count and key (call ID), so a call's frames and events land on the same worker;
- input topics run with faust's acks off: offsets are committed by ``commit_durable`` from the
  processor's ``OffsetTracker`` (see pipeline/worker/offsets.py for why);
- timers close quiet calls, make finished calls durable, update lag, hot-reload the model, and stop the
  worker (exit status 1) once it is unhealthy (pipeline/worker/health.py), for a supervisor to restart;
- a bad frame is dead-lettered alone; an exception that is no input's fault is fatal (nothing more is
  committed, the worker exits, the next one replays);
- web views: /metrics and /health (open), /api/calls, /api/calls/{call_id}, /api/query (checked read-only
  SQL; bearer token, own thread pool: the API server of pipeline/api/, started here), so `callqa report`
  works against the embedded store while this process holds it; the call pages (pipeline/web/views.py)
  are plugged into that server here too.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import faust
from aiokafka.errors import KafkaError
from faust.tables import TableManager
from faust.types import TP
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.api.auth import ApiAuth, auth_middleware, check_api_settings
from pipeline.api.limits import SourceLimit, request_size_middleware, source_limit_middleware
from pipeline.api.pool import QueryPool
from pipeline.api.server import register_api_views
from pipeline.asr.engine import Engine
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.broker.consumer import GroupCoordination, static_member_url, use_worker_consumer
from pipeline.broker.peers import LivenessListener, PeerWatch
from pipeline.broker.security import faust_credentials
from pipeline.broker.transactions import PartitionTransactions
from pipeline.config import Settings
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.live.desk import LiveDesk
from pipeline.live.views import register_live_views
from pipeline.notify.notifier import AlertNotifier
from pipeline.postcall.runner import PostCallRunner
from pipeline.qa.call import QaConfig
from pipeline.recordings.writer import CallRecorder
from pipeline.store.client import close_cached_clients, connect_when_free
from pipeline.store.migrations import migrate
from pipeline.store.sink import ClickHouseSink, SinkClosedError
from pipeline.web.views import register_web_views
from pipeline.worker import standby_priority
from pipeline.worker.allocator import release_free_memory, set_mmap_threshold, trim_available
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoint_topic import KafkaCheckpointStore
from pipeline.worker.dead_letters import describe_error
from pipeline.worker.frames import RejectedFrame
from pipeline.worker.health import Component, WorkerHealth, exit_after
from pipeline.worker.instance_lock import STANDBY_READY, InstanceLock, instance_listener
from pipeline.worker.kafka_output import FaustOutput, TransactionalOutput
from pipeline.worker.log_repeats import collapse_client_repeats
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.retention import sweep_now
from pipeline.worker.transcriber import BatcherTranscriber

log = logging.getLogger("callqa.worker")

# The whole hand-over (settle, flush, commit) stays under this share of the session timeout, whatever
# the store or the broker does: faust's own revocation steps and the rejoin need the rest.
HANDOVER_SHARE_OF_SESSION = 0.6


def handover_budget_s(settings: Settings) -> float:
    """How long a revocation may spend making calls durable before it hands their partitions over."""
    return min(settings.handover_timeout_s, settings.kafka_session_timeout_s * HANDOVER_SHARE_OF_SESSION)


@dataclass
class Worker:
    app: faust.App
    processor: CallProcessor
    transcriber: BatcherTranscriber
    sink: ClickHouseSink
    watch: PeerWatch | None = None


@dataclass(frozen=True)
class HeldMessage:
    """Where a frame held for its partition's checkpoints came from, for its dead letter: its batch's
    message is gone by then (its raw bytes too: the letter carries the decoded frame's)."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes = b""

    @classmethod
    def of(cls, bad: RejectedFrame) -> HeldMessage:
        return cls(bad.tp[0], bad.tp[1], bad.offset, bad.frame.call_id.encode())


def build_worker(settings: Settings, wait_turn: Callable[[], None] = lambda: None) -> Worker:
    """The worker, ready to run. ``wait_turn`` is called once the model is loaded and before anything only
    one process may hold (the store, the liveness port, the group membership): a standby waits there for the
    worker it replaces to exit (pipeline/worker/instance_lock.py)."""
    check_api_settings(settings)
    metrics = WorkerMetrics()
    # The model first: its load (and each inference process's canary) is most of a start.
    transcriber = BatcherTranscriber.from_settings(settings, metrics)
    wait_turn()
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)  # faust makes only the last folder
    api_auth = ApiAuth.from_settings(settings)
    # Bound before the app: the consumer's client id tells the peers where it listens (pipeline/broker/peers.py).
    listener = liveness_listener(settings) if settings.peer_watch else None
    # With static membership, faust's URL for this worker names its instance, not its address (see there).
    member_url: dict[str, Any] = ({"canonical_url": static_member_url(settings.worker_instance_id)}
                                  if settings.worker_instance_id else {})
    app = faust.App(
        settings.worker_id,
        broker=f"kafka://{settings.bootstrap}",
        # SASL (with the configured mechanism) and/or TLS for faust's consumer, producer and admin.
        broker_credentials=faust_credentials(settings),
        store="memory://",
        # faust's own state folder (it keeps nothing here: store is memory) under the state dir, not the cwd.
        datadir=str(settings.state_dir / "faust" / "{conf.name}-data"),
        web_host=settings.web_host,
        web_port=settings.web_port,
        **member_url,
        web_bind=settings.web_host,
        stream_buffer_maxsize=settings.stream_buffer_maxsize,
        broker_max_poll_records=settings.max_poll_records,
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=settings.kafka_heartbeat_interval_s or min(1.0, settings.kafka_session_timeout_s / 5),
        broker_client_id=listener.identity.client_id if listener is not None else f"faust-{faust.__version__}",
        consumer_group_instance_id=settings.worker_instance_id or None,
        consumer_metadata_max_age_ms=round(settings.kafka_metadata_max_age_s * 1000),
        consumer_auto_offset_reset="earliest",
        topic_replication_factor=settings.replication_factor,
        producer_acks=-1,
        # /api/* needs the bearer token (pipeline/api/auth.py); faust's own pages are not served.
        # In front of it, request sizes and each source's requests in flight are bounded (pipeline/api/limits.py).
        web_application_options={"client_max_size": settings.api_max_request_bytes, "middlewares": [
            request_size_middleware(settings.api_max_request_bytes, api_auth.refusals),
            source_limit_middleware(SourceLimit(settings.api_source_max_concurrent), api_auth.refusals),
            auth_middleware(api_auth)]},
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        TableManager=TablelessTableManager,
    )
    use_worker_consumer(app, settings.fetch_min_bytes, settings.fetch_max_wait_ms)
    serde = Serde.from_settings(settings.schema_registry_url)
    metrics.registry.register(api_auth.refusals.counter)  # the API's refusals on the worker's /metrics
    watch = None
    if listener is not None:
        # Started now, so the listener greets peers as soon as the consumer joins. Never closed: its sockets
        # close when the process ends, after a goodbye if it stops cleanly (flush_on_shutdown).
        watch = PeerWatch(settings, settings.worker_id, listener, settings.peer_watch_interval_s,
                          on_evicted=lambda client_id, removed: metrics.peer_evictions.inc(len(removed)))
        watch.start()
        watching = watch.watched
        metrics.peers_watched.set_function(lambda: len(watching))
    # Not on a thread beside the rest of the start, although the embedded engine's start is most of a
    # standby's take-over (0.4 s, 2.6 s after 20 minutes of inserts): chdb changes the process's working
    # directory while it starts, so a file read meanwhile by a relative path (the rules) is not found.
    # A standby may find its predecessor's engine still closing (hand_over_instance).
    store_client = connect_when_free(settings.writer_url, settings.clickhouse_database, STORE_HANDOVER_WAIT_S)
    migrate(store_client, settings.clickhouse_database)
    sink = ClickHouseSink(settings.writer_url, settings.clickhouse_database)

    # Whether a call is finished, and where an open one resumes, comes from the checkpoint topic, read
    # once per partition on assignment: no store lookup in the hot path.
    # Exactly once: what the calls of input partition p produce, checkpoints included, goes in p's
    # transaction, committed with p's offsets by commit_now (pipeline/broker/transactions.py).
    transactions = (PartitionTransactions(settings, settings.worker_id, settings.transaction_timeout_s,
                                          lambda p: TP(settings.topic_audio, p) in app.consumer.assignment())
                    if settings.exactly_once else None)
    output = TransactionalOutput(transactions, serde) if transactions is not None else FaustOutput(app, serde)
    processor = CallProcessor(
        settings, transcriber, output, sink, transcriber.engine.open_front_end,
        QaConfig.from_settings(settings), metrics,
        checkpoints=KafkaCheckpointStore(app, settings, serde, transactions),
        # Live summaries on faust's producer, never in a partition's transaction: the desk reads them
        # read_uncommitted, and nothing of exactly once (locks, fencing, commits) waits on them.
        live_output=FaustOutput(app, serde),
    )

    def lag(tp: tuple[str, int]) -> int:
        """Messages of ``tp`` not processed yet; -1 while unknown (not assigned, not fetched, nothing read)."""
        if TP(*tp) not in app.consumer.assignment():
            return -1  # lost in a rebalance, or not yet ours: unknown, never an error
        highwater = app.consumer.highwater(TP(*tp))
        consumed = processor.offsets.consumed_up_to(tp)
        if highwater is None:
            return -1
        if consumed is None:
            return 0 if highwater == 0 else -1
        return max(0, highwater - consumed)

    processor.lag = lag
    # acks=False: faust neither acks nor commits these topics; commit_durable does.
    audio_topic = app.topic(settings.topic_audio, key_serializer="raw", value_serializer="raw", acks=False)
    events_topic = app.topic(settings.topic_call_events, key_serializer="raw", value_serializer="raw", acks=False)

    async def dead_letter(msg: Any, exc: Exception, frame: AudioFrame | None = None) -> None:
        # The message's bytes are never logged: ids and the error are enough to find it on its topic.
        log.warning("dead letter from %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, describe_error(exc))
        letter = processor.dead_letter_message((msg.topic, msg.partition), msg.offset, msg.key, msg.value or b"",
                                               exc, frame)
        try:
            delivery = await output.publish(settings.topic_dead_letters, letter.call_id, letter, msg.partition)
            await delivery
        except Exception as err:  # noqa: BLE001 - see below
            # Neither processed nor dead-lettered: its offset stays held. Raised out of the agent, it made
            # faust restart the agent quietly and the batch's other frames were lost; failing stops every
            # commit and the worker exits, so the next one reads the message again.
            failed(f"dead letter of {msg.topic}[{msg.partition}]@{msg.offset}", err)
            return
        processor.dead_letter_delivered((msg.topic, msg.partition), msg.offset)

    def failed(what: str, exc: Exception) -> None:
        """An exception that is no input's fault (a bug): dead-lettering the input would lose accepted
        audio, so the worker stops committing and reports itself unhealthy; the next one replays it."""
        log.error("%s failed: %s", what, describe_error(exc))
        processor.fail(f"{what} failed: {describe_error(exc)}")

    async def consume_audio(stream: Any) -> None:
        # Frames are taken in small batches so the VAD scores all legs that got audio in one run.
        async for events in stream.take_events(settings.frame_batch_max, within=settings.frame_batch_within_ms / 1000):
            if processor.failures:
                continue  # about to exit: nothing more is committed, so nothing more is worth doing
            decoded: list[tuple[Any, AudioFrame]] = []
            for event in events:
                msg = event.message
                try:
                    decoded.append((msg, serde.decode(msg.value, AudioFrame)))
                except Exception as exc:  # noqa: BLE001 - bad input goes to the dead-letter topic
                    await dead_letter(msg, exc)
            try:
                rejected = await processor.on_frames([((m.topic, m.partition), m.offset, f) for m, f in decoded])
                by_position = {((m.topic, m.partition), m.offset): m for m, _ in decoded}
                for bad in rejected:  # each bad frame alone; the rest of the batch went on
                    await dead_letter(by_position.get((bad.tp, bad.offset)) or HeldMessage.of(bad), bad.error,
                                      bad.frame)
            except Exception as exc:  # noqa: BLE001 - a bug, not bad input: fatal (see failed)
                failed(f"frame batch of {len(decoded)} frames", exc)

    async def consume_events(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            if processor.failures:
                continue
            try:
                call_event = serde.decode(msg.value, CallEvent)
            except Exception as exc:  # noqa: BLE001 - bad input goes to the dead-letter topic, the worker goes on
                await dead_letter(msg, exc)
                continue
            try:
                await processor.on_event((msg.topic, msg.partition), msg.offset, call_event)
            except Exception as exc:  # noqa: BLE001 - a bug, not bad input: fatal (see failed)
                failed(f"call event {msg.topic}[{msg.partition}]@{msg.offset}", exc)

    @app.agent(audio_topic, name="audio")
    async def audio_agent(stream: Any) -> None:
        await consume_audio(stream)

    @app.agent(events_topic, name="events")
    async def events_agent(stream: Any) -> None:
        await consume_events(stream)

    @app.timer(interval=1.0)
    async def close_quiet_calls() -> None:
        await processor.tick()
        try:  # frames held while their partition's checkpoints were read, if no batch took them since
            for bad in await processor.release_waiting():
                await dead_letter(HeldMessage.of(bad), bad.error, bad.frame)
        except Exception as exc:  # noqa: BLE001 - a bug, not bad input: fatal (see failed)
            failed("frames held for their partition's checkpoints", exc)
        stats = sink.stats
        metrics.store_buffered_rows.set(stats.buffered_rows)
        metrics.store_retries.set(stats.retries)
        for topic, partition in processor.offsets.partitions():
            metrics.consumer_lag.labels(topic, str(partition)).set(max(0, lag((topic, partition))))

    @app.timer(interval=settings.commit_interval_s)
    async def commit_durable() -> None:
        await commit_now()

    async def commit_now() -> None:
        assigned = app.consumer.assignment()
        # What the group had committed when this worker got its partitions: a "finished" record a previous
        # owner left is deleted once commits pass it, also on a partition quiet since (this worker then
        # commits nothing there; its own commits alone left such records on the topic for good).
        earlier = getattr(app.consumer, "committed_at_assignment", {})
        processor.offsets.committed({(tp.topic, tp.partition): o for tp, o in earlier.items()
                                     if tp in assigned and tp.topic in input_topics})
        owned = owned_audio_partitions()
        try:
            offsets = await processor.make_durable()
        except SinkClosedError:
            # Shutting down (flush_on_shutdown closes the sink on a bound) while this
            # waited for the store: nothing is committed, what was not stored is read again by the next owner.
            return
        except KafkaError as exc:
            if owned_audio_partitions() != owned:
                # A rebalance moved partitions while their checkpoints were being delivered: a stopped
                # producer's batch fails (OutOfOrderSequenceNumber, seen on CI's scale-out test). Nothing is
                # committed this round; the partitions' new owners replay from the last commit.
                log.info("commit skipped: partitions moved while checkpoints were delivered (%s)", exc)
                return
            raise
        offsets = {tp: o for tp, o in offsets.items() if TP(*tp) in assigned}
        if transactions is not None:
            await commit_transactions(offsets, {tp.partition for tp in assigned if tp.topic == settings.topic_audio})
            return
        # faust has no public call that commits given offsets: Consumer.commit() commits what faust's
        # own acks track, which these topics do not use (acks=False, see offsets.py). _commit_offsets is
        # what it calls underneath; it flushes the producer first and skips unassigned partitions.
        if offsets and await app.consumer._commit_offsets(  # type: ignore[attr-defined]
            {TP(t, p): o for (t, p), o in offsets.items()}
        ):
            processor.offsets.committed(offsets)
            metrics.commits.inc()

    async def commit_transactions(offsets: dict[tuple[str, int], int], partitions: set[int]) -> None:
        """Each owned partition's transaction, with its offsets and a record of what its calls published
        (CallProcessor.commit_transactions); a failed commit is fatal: the next owner replays."""
        assert transactions is not None
        by_partition: dict[int, dict[tuple[str, int], int]] = {}
        for (topic, partition), offset in offsets.items():
            by_partition.setdefault(partition, {})[(topic, partition)] = offset
        try:
            committed = await processor.commit_transactions(offsets, partitions, lambda: transactions.commit(
                {p: o for p, o in by_partition.items() if p in partitions}))
        except Exception as exc:  # noqa: BLE001 - fenced or refused: what is open is the next owner's to replay
            if moved := partitions - owned_audio_partitions():
                # Some of them moved during the commit (their new owner fenced this producer): theirs to replay,
                # and no fault of this worker's; the partitions it keeps commit at the next interval.
                log.info("transactions of partitions %s not committed: they moved meanwhile (%s)",
                         sorted(moved), describe_error(exc))
                return
            failed("transaction commit", exc)
            return
        if committed:  # not while a call has failed or a rebalance is under way: nothing was committed then
            metrics.commits.inc()

    input_topics = {settings.topic_audio, settings.topic_call_events}

    def owned_audio_partitions() -> set[int]:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == settings.topic_audio}

    if transactions is not None:
        @app.timer(interval=settings.commit_interval_s)
        async def commit_outputs() -> None:
            # Outputs commit on time even while commit_durable waits for the store (an outage): their open
            # transaction would otherwise reach transaction_timeout_s and be aborted by the broker, and the
            # post-call jobs and QA results in it would wait for the store. The offsets are only what is
            # committable already (checkpoints sent before their holds moved): a replay from them publishes
            # nothing of what these transactions hold (the records of what was published come with them).
            assigned = app.consumer.assignment()
            offsets = {tp: o for tp, o in processor.offsets.committable().items() if TP(*tp) in assigned}
            await commit_transactions(offsets, {tp.partition for tp in assigned if tp.topic == settings.topic_audio})

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def hand_over_calls(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        # Still a member of the group here: commit what is durable, within a bound (a store outage must
        # not hang the group's rebalance), then pause the revoked partitions' calls (CallProcessor.hand_over).
        ours = {(tp.topic, tp.partition) for tp in revoked if tp.topic in input_topics}
        if ours:
            await processor.hand_over(ours, handover_budget_s(settings), commit_now,
                                      store_failing=lambda: sink.stats.last_error is not None)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def take_over_calls(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        before = {tp for tp in processor.offsets.partitions()}
        processor.on_assigned({(tp.topic, tp.partition) for tp in assigned if tp.topic in input_topics})
        if transactions is not None:
            # After on_assigned stopped the calls of partitions that moved: their producers stop (aborting
            # what they had open), and a new partition's producer fences its previous owner's.
            await transactions.assign({tp.partition for tp in assigned if tp.topic == settings.topic_audio})
        for topic, partition in before - set(processor.offsets.partitions()):
            with contextlib.suppress(KeyError):
                metrics.consumer_lag.remove(topic, str(partition))

    if settings.model_watch_interval_s > 0:
        @app.timer(interval=settings.model_watch_interval_s)
        async def watch_model() -> None:
            await transcriber.reload_if_newer()

    @app.page("/metrics")
    async def metrics_view(web: Any, request: Any) -> Any:
        # aiohttp wants the charset apart from the content type.
        return web.bytes(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    postcall = post_call_runner(settings, transcriber, FaustOutput(app, serde), sink, metrics, serde)
    parts: dict[str, Component] = {"batcher": transcriber, "store sink": sink,
                                   "Kafka group coordination": GroupCoordination(app)}
    if postcall is not None:
        parts["post-call pass"] = postcall
    health = WorkerHealth(parts, lambda: processor.failures)

    @app.page("/health")
    async def health_view(web: Any, request: Any) -> Any:
        # Open like /metrics: a supervisor or load balancer probes it without the API token.
        status, body = health.report()
        return web.json(body, status=status)

    @app.timer(interval=1.0)
    async def exit_when_unhealthy() -> None:
        reason = health.exit_reason()
        if reason is not None:
            # A crash stops faust's worker with exit status 1; the timer ends it if stopping hangs.
            exit_after(settings.unhealthy_exit_timeout_s)
            await app.crash(reason)

    @app.timer(interval=settings.retention_sweep_interval_s)
    async def sweep_store() -> None:  # retention, and erased calls' rows that came back
        await sweep_now(settings)

    if settings.malloc_trim_interval_s > 0 and trim_available():
        @app.timer(interval=settings.malloc_trim_interval_s)
        async def trim_free_memory() -> None:
            await asyncio.to_thread(release_free_memory)

    api_pool = QueryPool(settings.api_query_threads, settings.api_query_max_waiting)
    # The call pages and the live desk plug into the API server. The desk follows the topics only while
    # someone looks (pipeline/live/desk.py): a worker nobody watches reads nothing for it.
    api_server = register_api_views(app, settings, api_pool, api_auth)
    register_web_views(api_server)
    live_desk = LiveDesk(settings)
    register_live_views(api_server, live_desk)

    @app.timer(interval=min(30.0, settings.live_idle_stop_s))
    async def stop_idle_live_desk() -> None:
        await live_desk.stop_if_idle()

    # Live alerts to the webhooks their rules name, on a thread of its own (pipeline/notify/).
    notifier = AlertNotifier.from_settings(settings, QaConfig.from_settings(settings), metrics.registry)

    @app.task
    async def start_batcher() -> None:
        await transcriber.start()
        if postcall is not None:
            postcall.start()
        if notifier is not None:
            notifier.start()

    if settings.debug_raw_audio:
        @app.task
        async def warn_raw_audio_at_rest() -> None:
            # A task, not a plain call: it runs once faust's logging is set up, so the line lands in the log.
            log.warning("CALLQA_DEBUG_RAW_AUDIO is on: dead letters on %s carry raw message bytes and segment "
                        "audio, kept %.0f days; turn it off outside debugging", settings.topic_dead_letters,
                        settings.dead_letter_retention_ms / 86_400_000)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def flush_on_shutdown(app: Any, **kwargs: Any) -> None:
        # The consumer has stopped: finish what is in flight, store it and commit what is durable, as at
        # any commit interval: open calls are replayed by the next worker from their checkpoints (ids make
        # that idempotent). The commit matters: the finals drained here were otherwise aborted with their
        # transaction, decoded again by the next owner and published only after the restart (a turn that
        # ended just before a static member's restart waited its whole pause and a second decode).
        # Not when unhealthy: segments queued for a batcher that died would be waited for forever (and
        # nothing is committed: the next worker replays them). Bounded anyway.
        # Each step's time goes in one line: a static member's restart pauses its calls for all of them.
        steps = StopSteps(time.monotonic() - stop_began[0] if stop_began else 0.0)
        await live_desk.close()  # its streams end now: a browser reconnects to another desk
        if notifier is not None:  # told now, waited for last: its group leave must not lengthen the pause
            notifier.stop()
        if watch is not None:  # a clean stop: no peer evicts us when our sockets close
            await asyncio.get_running_loop().run_in_executor(None, watch.say_goodbye)
        steps.done("goodbye")
        if not health.reasons():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(processor.drain(), settings.unhealthy_exit_timeout_s / 2)
        steps.done("drain")
        # Not while the store refuses writes: nothing can become durable then, and the attempt only made a
        # stop in an outage its whole bound longer (the chaos run's restarts came late behind it).
        if not health.reasons() and sink.stats.last_error is None:
            try:  # within the hand-over's bound: a store outage must not hold the stop (nothing is lost)
                await asyncio.wait_for(commit_now(), handover_budget_s(settings))
            except Exception as exc:  # noqa: BLE001 - not committed: the next owner replays it, as before
                log.warning("clean stop: last commit not made (%s); the next owner replays from the one before",
                            describe_error(exc) if not isinstance(exc, TimeoutError) else "timed out")
        steps.done("commit")
        if postcall is not None:  # its job in hand is left uncommitted: the next owner redoes it
            await postcall.close()
        steps.done("post-call")
        try:
            # Bounded: during a store outage it retried until the store came back, and a supervisor's SIGKILL
            # came first. What it gives up is not committed (make_durable flushes before any commit): replayed.
            await sink.close(timeout_s=settings.unhealthy_exit_timeout_s / 2)
        except Exception as exc:  # noqa: BLE001 - not committed, so replayed: still close the rest
            log.error("store sink did not close cleanly: %s", describe_error(exc))
        steps.done("store")
        await transcriber.close()
        steps.done("inference")
        if transactions is not None:  # nothing more is committed: what is open is aborted, and replayed
            await transactions.close()
        steps.done("transactions")
        if notifier is not None:  # an alert whose request was in flight is sent again by the next owner
            await asyncio.to_thread(notifier.close, 5.0)
        api_pool.shutdown()
        log.info("clean stop: %s", steps)

    return Worker(app, processor, transcriber, sink, watch)


def post_call_runner(settings: Settings, transcriber: BatcherTranscriber, output: FaustOutput, sink: ClickHouseSink,
                     metrics: WorkerMetrics, serde: Serde) -> PostCallRunner | None:
    """The finished calls' jobs: recordings (``recordings`` on) and the post-call pass (``final_model`` set: the
    accurate model, loaded and checked at start)."""
    if settings.final_model and not settings.post_call_model:
        log.warning("CALLQA_FINAL_MODEL is the live model (%s): a post-call pass would decode the same text again; "
                    "no pass", settings.model)
    if not settings.post_call_model and not settings.recordings:
        return None
    final = Engine.load(settings.post_call_model, settings=settings) if settings.post_call_model else None

    async def decode_checks(segments: Sequence[AudioSegment]) -> list[TranscriptResult | BaseException]:
        """A recording's cut checks by the live model, through the live batcher (the runner waits for room)."""
        return await asyncio.gather(*(transcriber.batcher.submit(s) for s in segments), return_exceptions=True)

    recorder = CallRecorder(settings, decode_checks) if settings.recordings else None
    return PostCallRunner(settings, final, transcriber.engine, lambda: transcriber.batcher.queued, output.publish,
                          sink, metrics, QaConfig.from_settings(settings), serde, recorder)


# Their debug lines print whole message keys and values (send: ... v=..., Sending (key=... value=...),
# Request/Response structs): transcripts, dead letters and audio frames would land in the worker's log.
PAYLOAD_LOGGERS = ("faust.topics", "faust.transport.drivers.aiokafka", "aiokafka.producer.producer", "aiokafka.conn")


def quiet_payload_loggers() -> None:
    """Keep the loggers that print message payloads at INFO or above, whatever the worker's log level."""
    for name in PAYLOAD_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.level, logging.INFO))


def run_worker(settings: Settings, loglevel: str = "warning") -> None:
    """Run the worker until SIGTERM/SIGINT (faust's worker handles the signals)."""
    from faust.worker import Worker as FaustWorker

    set_mmap_threshold(settings.malloc_mmap_threshold_bytes)  # before the model's buffers are allocated
    worker = build_worker(settings, instance_turn(settings))
    # Before faust sets up logging: it configures the root logger only, so these levels and filters stay.
    quiet_payload_loggers()
    collapse_client_repeats()
    try:
        prompt_exit_worker(FaustWorker)(worker.app, loglevel=loglevel, quiet=True,
                                        redirect_stdouts=False).execute_from_commandline()
    except SystemExit as stopped:  # how faust ends the process once the worker has stopped
        if hand_over_instance(worker):
            exit_at_once(stopped.code)
        raise


def hand_over_instance(worker: Worker) -> bool:
    """A static member that has stopped hands its instance to its standby now, not when its process ends
    (True when it held one). What the successor takes must be free first: the liveness port (closed after
    the goodbye) and the embedded store (its engine shuts down with its last handle; one still open
    elsewhere keeps it until this process ends, which the successor waits out)."""
    if not _held_locks:
        return False
    # A step that fails leaves its part to the process's end, which the successor waits out (the store) or
    # which costs it only its watched port: the lock goes either way.
    with contextlib.suppress(Exception):
        if worker.watch is not None:
            worker.watch.close(timeout_s=1.0)
    with contextlib.suppress(Exception):
        close_cached_clients()
    while _held_locks:
        _held_locks.pop().release()
    return True


def exit_at_once(code: object) -> NoReturn:
    """End a stopped worker that handed its instance over without the interpreter's teardown: freeing the
    model's sessions, modules and arenas took half a second of CPU (2 cores), just when the successor opens
    the store and joins, which slowed its start by as much as the early hand-over gained. Everything of
    worth is flushed, committed or left to replay by then; the exit handlers (logging's flush among them)
    still run."""
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def liveness_listener(settings: Settings) -> LivenessListener:
    """This worker's liveness listener; a static member's keeps its instance's client id across restarts."""
    host = settings.peer_watch_host or settings.web_host
    if settings.worker_instance_id:
        return instance_listener(host, settings.peer_watch_port, settings.state_dir, settings.worker_id,
                                 settings.worker_instance_id)
    return LivenessListener(host, settings.peer_watch_port, settings.worker_id)


def instance_turn(settings: Settings) -> Callable[[], None]:
    """With a static instance id: this worker's wait for its turn. Taken at once when no live process on this
    host holds the id; otherwise this worker is a standby, said on stderr (faust's logging is not up yet), and
    the wait ends when the holder exits (pipeline/worker/instance_lock.py)."""
    if not settings.worker_instance_id:
        return lambda: None
    lock = InstanceLock(settings.state_dir, settings.worker_id, settings.worker_instance_id)
    if lock.try_acquire():
        _held_locks.append(lock)
        return lambda: None
    # Loaded on the CPU the worker it replaces leaves unused (standby_priority.py), where that can be undone.
    refused = standby_priority.to_idle()
    idle = not refused
    priority = " at idle CPU priority" if idle else f" (at normal CPU priority: {refused})"
    print(f"worker {settings.worker_id}: standby: instance {settings.worker_instance_id!r} is held by pid "
          f"{lock.holder() or '?'} on this host; loading the model{priority}, then taking over when it exits",
          file=sys.stderr, flush=True)

    def wait() -> None:
        began = time.monotonic()
        print(f"worker {settings.worker_id}: {STANDBY_READY}, waiting for instance {settings.worker_instance_id!r}",
              file=sys.stderr, flush=True)
        lock.acquire()
        _held_locks.append(lock)
        if idle:
            standby_priority.to_normal()
        print(f"worker {settings.worker_id}: taking over instance {settings.worker_instance_id!r} after "
              f"{time.monotonic() - began:.1f} s standing by", file=sys.stderr, flush=True)

    return wait


# Longest a standby waits for its predecessor's embedded store to close (it closes within a second).
STORE_HANDOVER_WAIT_S = 10.0

# When this process was asked to stop (SIGTERM, SIGINT): the clean stop's line starts its account there.
stop_began: list[float] = []


class StopSteps:
    """How long each step of a clean stop took, said as one line: ``consumer`` is from the signal to the
    shutdown hook (faust stopping the consumer and waiting for every fetched message to be processed)."""

    def __init__(self, consumer_s: float) -> None:
        self.took: dict[str, float] = {"consumer": consumer_s}
        self.mark = time.monotonic()

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.took[step], self.mark = now - self.mark, now

    def __str__(self) -> str:
        return f"{sum(self.took.values()):.2f} s (" + ", ".join(f"{k} {v:.2f}" for k, v in self.took.items()) + ")"


# Held for the life of the process: a lock's file closes (and the lock goes) when its object is collected.
_held_locks: list[InstanceLock] = []


class TablelessTableManager(TableManager):  # type: ignore[misc]
    """faust's table manager without the 1 s it sleeps at start, for tables an app declares late: the worker
    declares none, and that second was a second more of every (re)start before the group join (a restarted
    worker's calls waited it). With tables (none today) it waits as faust does."""

    async def on_start(self) -> None:
        if len(self):
            await super().on_start()
        elif not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


def prompt_exit_worker(base: type[Any]) -> type[Any]:
    """faust's worker without mode's two fixed waits at exit: 1 s for tasks left after every service stopped
    (there always are some: timers, the web server's), then 1 s of a sentinel sleep before the loop closes.
    By then flush_on_shutdown has stored, committed or left for replay everything, so those 2 s were only
    the time a restarted worker's calls waited longer (a rolling restart: 2.3 s of a 5 s pause) and every
    worker stop of the test suite. What is left is cancelled after 0.2 s and given 0.1 s to unwind."""

    class PromptExitWorker(base):  # type: ignore[misc,valid-type]
        def _schedule_shutdown(self, signal: Any) -> None:
            stop_began.append(time.monotonic())  # the clean stop's line counts its steps from here
            super()._schedule_shutdown(signal)

        def _gather_all(self) -> None:
            for _ in range(20):
                if not asyncio.all_tasks(loop=self.loop):
                    break
                self.loop.run_until_complete(asyncio.sleep(0.01))
            for task in asyncio.all_tasks(loop=self.loop):
                task.cancel()

        async def _sentinel_task(self) -> None:
            await asyncio.sleep(0.1)

    return PromptExitWorker
