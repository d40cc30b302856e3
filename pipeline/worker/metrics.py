"""Prometheus metrics of the worker, served at /metrics on its web port.

Names match the Operations dashboard and the alert rules in dashboards/prometheus/.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from pipeline.contracts.serde import ContractError

# Label values exported at 0 from the start. A labelled series that appears only at its first
# increment has no earlier sample, so rate()/increase() never see that increment and the dashboard's
# "Dropped frames" / "Dead letters" panels stay empty until a second one: Prometheus's advice is to
# initialise the label values you know. Reasons: pipeline/worker/intake.py; a dead letter's reason is
# its exception's class, ContractError for any message that does not decode.
FRAME_DROP_REASONS = ("duplicate", "late", "after_call_end", "before_checkpoint")
DEAD_LETTER_REASONS = (ContractError.__name__,)
# Why a hot reload was refused: pipeline/worker/transcriber.py refusal_reason().
MODEL_REFUSAL_REASONS = ("version", "format", "integrity", "signature", "canary")
# Kinds of call task (pipeline/worker/tasks.py TaskKind).
TASK_KINDS = ("segment", "emit", "finish", "partial")
# What became of early decodes (pipeline/worker/early.py).
EARLY_DECODE_OUTCOMES = ("started", "used", "overtaken")
# What became of partial transcripts (pipeline/worker/partials.py).
PARTIAL_OUTCOMES = ("published", "skipped", "dropped", "superseded", "failed")

POSTCALL_OUTCOMES = ("written", "no_audio", "failed")

# Delays of a few tens of ms up to tens of seconds (a backlog after an overload).
DELAY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    """One registry per worker so tests can run several workers' cores in one process."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, for the memory alert
        self.active_calls = Gauge("callqa_active_calls", "Calls with state in this worker.", registry=r)
        self.active_legs = Gauge("callqa_active_legs", "Call legs with state in this worker.", registry=r)
        self.final_delay = Histogram(
            "callqa_final_delay_seconds", "Segment end (last frame produced) -> final transcript produced.",
            buckets=DELAY_BUCKETS, registry=r,
        )
        self.partial_delay = Histogram(
            "callqa_partial_delay_seconds", "Audio captured -> partial transcript produced.",
            buckets=DELAY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "callqa_batch_size", "Segments per inference batch.", buckets=(1, 2, 4, 6, 8, 12, 16, 24, 32), registry=r,
        )
        self.inference_seconds = Histogram(
            "callqa_inference_seconds", "Encoder+decoder time per batch.", buckets=DELAY_BUCKETS, registry=r,
        )
        self.batcher_queue_depth = Gauge("callqa_batcher_queue_depth", "Segments waiting in the batcher.", registry=r)
        self.inflight_audio_bytes = Gauge(
            "callqa_inflight_audio_bytes", "Decoded audio held by open legs and queued segments.", registry=r,
        )
        self.inflight_audio_peak_bytes = Gauge(
            "callqa_inflight_audio_peak_bytes", "Most audio ever in flight at once (checks the bound).", registry=r,
        )
        self.consumer_lag = Gauge(
            "callqa_consumer_lag", "Messages behind the log end, per input partition.", ["topic", "partition"],
            registry=r,
        )
        self.frames = Counter("callqa_frames_total", "Audio frames consumed.", registry=r)
        self.early_decodes = Counter(
            "callqa_early_decodes_total",
            "Open segments decoded before their endpoint: started, used for the final, overtaken by speech.",
            ["outcome"], registry=r,
        )
        for outcome in EARLY_DECODE_OUTCOMES:
            self.early_decodes.labels(outcome)
        self.partials = Counter(
            "callqa_partials_total",
            "Partial transcripts due: published, skipped (budget busy), dropped (stale behind finals), "
            "superseded (segment closed or silent), failed.",
            ["outcome"], registry=r,
        )
        for outcome in PARTIAL_OUTCOMES:
            self.partials.labels(outcome)
        self.frames_dropped = Counter(
            "callqa_frames_dropped_total", "Frames not used, by reason.", ["reason"], registry=r,
        )
        self.gap_frames = Counter("callqa_gap_frames_total", "Missing frames filled with silence.", registry=r)
        self.segments = Counter("callqa_segments_total", "Transcript segments produced.", ["kind"], registry=r)
        self.segment_failures = Counter("callqa_segment_failures_total", "Segments whose inference failed.", registry=r)
        self.dead_letters = Counter("callqa_dead_letters_total", "Messages sent to the dead-letter topic.", ["reason"],
                                    registry=r)
        self.calls_finished = Counter("callqa_calls_finished_total", "Calls finalised, by how.", ["how"], registry=r)
        # Frames still in flight when a call closes are lost: counted, so a close that did not wait long
        # enough (CALLQA_END_WAIT_MAX_S, lifecycle.py) shows.
        self.calls_closed_incomplete = Counter(
            "callqa_calls_closed_incomplete_total",
            "Calls closed on their end (or abort) event without every frame it announced, by how.", ["how"],
            registry=r,
        )
        for how in ("end", "abort"):
            self.calls_closed_incomplete.labels(how)
        self.holds = Counter("callqa_holds_total", "Holds (hold/resume call events) of finished calls.", registry=r)
        self.hold_seconds = Counter("callqa_hold_seconds_total", "Time finished calls spent on hold (call time).",
                                    registry=r)
        self.qa_alerts = Counter("callqa_qa_alerts_total", "Live QA alerts raised.", ["rule"], registry=r)
        self.store_buffered_rows = Gauge("callqa_store_buffered_rows", "Rows waiting for ClickHouse.", registry=r)
        self.store_retries = Gauge("callqa_store_retries", "ClickHouse insert retries so far.", registry=r)
        self.commits = Counter("callqa_offset_commits_total", "Input offset commits.", registry=r)
        # Scale-out and bounded replay (pipeline/worker/checkpoints.py).
        self.leg_audio_seconds = Counter(
            "callqa_leg_audio_seconds_total", "Audio fed to the legs' segmenters (s), all legs.", registry=r,
        )
        self.checkpoints = Counter(
            "callqa_checkpoints_total", "Call checkpoints made durable, by status.", ["status"], registry=r,
        )
        self.calls_resumed = Counter(
            "callqa_calls_resumed_total", "Calls restored from a checkpoint (after a crash or a rebalance).", registry=r,
        )
        self.calls_kept = Counter(
            "callqa_calls_kept_on_rebalance_total",
            "Open calls whose partition came back to this worker in a rebalance: kept, not re-decoded.", registry=r,
        )
        self.calls_dropped = Counter(
            "callqa_calls_dropped_on_revoke_total",
            "Open calls handed over on a rebalance (their new owner resumes them).", registry=r,
        )
        self.rebalances = Counter("callqa_rebalances_total", "Partition assignments received.", registry=r)
        self.checkpoint_load_seconds = Histogram(
            "callqa_checkpoint_load_seconds", "Reading one taken-over partition's call checkpoints (its calls wait).",
            buckets=DELAY_BUCKETS, registry=r,
        )
        self.peer_evictions = Counter(
            "callqa_peer_evictions_total",
            "Peer workers this worker removed from the group when their process died (pipeline/broker/peers.py).",
            registry=r,
        )
        # Read by whoever kills a worker on purpose (the chaos benchmark): a peer not watched yet (it just
        # joined, or its listener did not answer) is left to its session timeout when it dies.
        self.peers_watched = Gauge(
            "callqa_peers_watched", "Peer workers this worker holds a liveness connection to (pipeline/broker/peers.py).",
            registry=r,
        )
        # The post-call pass (pipeline/postcall): jobs written when calls finish, and the pass's work.
        self.postcall_jobs = Counter("callqa_postcall_jobs_total", "Post-call jobs written for finished calls.",
                                     registry=r)
        self.postcall_backlog = Gauge(
            "callqa_postcall_backlog", "Post-call jobs on this worker's job partitions not taken yet.", registry=r,
        )
        self.postcall_calls = Counter(
            "callqa_postcall_calls_total", "Post-call jobs taken, by outcome (written, no_audio, failed).", ["outcome"],
            registry=r,
        )
        for outcome in POSTCALL_OUTCOMES:
            self.postcall_calls.labels(outcome)
        self.postcall_cpu_seconds = Counter(
            "callqa_postcall_cpu_seconds_total", "CPU time of the post-call pass: reading the audio back, its VAD, its inference thread.", registry=r,
        )
        self.postcall_audio_seconds = Counter(
            "callqa_postcall_audio_seconds_total", "Call audio (both legs) the post-call pass transcribed.", registry=r,
        )
        self.postcall_read_bytes = Counter(
            "callqa_postcall_read_bytes_total",
            "Audio topic bytes read back for the post-call pass, by whose (call: the call's frames; other).",
            ["whose"], registry=r,
        )
        # Redacted recordings (pipeline/recordings), written by the same job's taker.
        self.recordings = Counter(
            "callqa_recordings_total", "Recordings of finished calls, by outcome (written, no_audio, failed).",
            ["outcome"], registry=r,
        )
        for outcome in POSTCALL_OUTCOMES:
            self.recordings.labels(outcome)
        self.recording_bytes = Counter("callqa_recording_bytes_total", "Bytes of recordings written.", registry=r)
        self.recording_cuts = Counter(
            "callqa_recording_cuts_total",
            "Stretches silenced in recordings, by the step whose check held (estimate, widened, segment).",
            ["how"], registry=r,
        )
        for how in ("estimate", "widened", "segment"):
            self.recording_cuts.labels(how)
        self.postcall_changes = Counter(
            "callqa_postcall_changes_total", "Finished calls whose final result differs from the live one, by what.",
            ["what"], registry=r,
        )
        for what in ("score", "auto_fail"):
            self.postcall_changes.labels(what)
        self.postcall_delay = Histogram(
            "callqa_postcall_delay_seconds", "Call finished -> its post-call revision written.",
            buckets=DELAY_BUCKETS + (120.0, 300.0, 900.0, 3600.0), registry=r,
        )
        self.model_version = Gauge("callqa_model_version", "Version of the model new segments use.", registry=r)
        self.model_reloads_refused = Counter(
            "callqa_model_reloads_refused_total",
            "Model versions refused for hot reload (the running one kept serving), by reason.", ["reason"], registry=r,
        )
        self.task_failures = Counter(
            "callqa_task_failures_total", "Call tasks that raised (a bug, not bad input), by task; the call fails.",
            ["task"], registry=r,
        )
        for task in TASK_KINDS:
            self.task_failures.labels(task)
        for reason in FRAME_DROP_REASONS:
            self.frames_dropped.labels(reason)
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason)
        for reason in MODEL_REFUSAL_REASONS:
            self.model_reloads_refused.labels(reason)
        for status in ("open", "closed", "finished"):
            self.checkpoints.labels(status)
