"""Typed messages, one dataclass per Avro record in schemas/ (field names and order match)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

Leg = Literal["agent", "customer"]
Encoding = Literal["pcm16", "mulaw", "alaw"]
LEGS: tuple[Leg, ...] = ("agent", "customer")

M = TypeVar("M", bound="Message")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Message:
    """Base of every contract message; ``SCHEMA`` names its .avsc file's record."""

    SCHEMA: ClassVar[str] = ""

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls: type[M], record: dict[str, Any]) -> M:
        # Unknown fields (written by a newer producer) are ignored; missing ones take their defaults.
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


@dataclass
class AudioFrame(Message):
    SCHEMA: ClassVar[str] = "io.callqa.AudioFrame"
    call_id: str
    leg: Leg
    seq: int
    start_ms: int
    sample_rate: int
    encoding: Encoding
    payload: bytes
    produced_at_ms: int = field(default_factory=now_ms)


CallEventType = Literal["start", "end", "abort", "hold", "resume", "pause", "unpause"]
HOLD_CHANGES = ("hold", "resume")
# A secure pause and its end: ``event_type`` in Python, the ``pause`` field's symbol on the wire.
PAUSE_CHANGES = {"pause": "pause", "unpause": "resume"}


@dataclass
class CallEvent(Message):
    """A call's start, end or abort, or the start (``hold``) or end (``resume``) of a hold: no frames come
    while a call is held, and its legs' clocks go on (``offset_ms`` is where on the call's clock).

    On the wire (schema version 2) a hold change is ``event_type`` start plus the ``hold`` field, not
    two new enum symbols: a reader of version 1 fails on an enum symbol it does not know, while it skips
    a field it does not know, so it reads a hold change as a repeated start (which a worker ignores
    except for the start time it records). In Python ``event_type`` says hold or resume directly.

    A secure pause (``pause``) and its end (``unpause``) are written the same way in version 3, as a start
    with the ``pause`` field (``pause`` / ``resume``): the call's capture was paused on purpose (payment), its
    audio dropped at the gateway, which QA keeps apart from holds. ``reason`` says why an unpause came
    without being asked for (the call ended while paused).
    """

    SCHEMA: ClassVar[str] = "io.callqa.CallEvent"
    call_id: str
    event_type: CallEventType
    tenant: str = ""
    agent_id: str = ""
    queue: str = ""
    direction: Literal["inbound", "outbound"] = "inbound"
    legs: list[str] = field(default_factory=list)
    sample_rate: int = 8000
    encoding: Encoding = "mulaw"
    frame_counts: dict[str, int] = field(default_factory=dict)
    reason: str | None = None
    at_ms: int = field(default_factory=now_ms)
    offset_ms: int = -1  # hold, resume, pause and unpause only: ms from the start of the call

    @property
    def is_hold_change(self) -> bool:
        return self.event_type in HOLD_CHANGES

    @property
    def is_pause_change(self) -> bool:
        return self.event_type in PAUSE_CHANGES

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["hold"] = self.event_type if self.is_hold_change else None
        record["pause"] = PAUSE_CHANGES.get(self.event_type)
        if self.is_hold_change or self.is_pause_change:
            record["event_type"] = "start"
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CallEvent:
        hold, pause = record.get("hold"), record.get("pause")
        event = super().from_record({k: v for k, v in record.items() if k not in ("hold", "pause")})
        if hold in HOLD_CHANGES:
            event.event_type = hold
        elif pause == "pause":
            event.event_type = "pause"
        elif pause == "resume":
            event.event_type = "unpause"
        return event


@dataclass
class TranscriptSegment(Message):
    SCHEMA: ClassVar[str] = "io.callqa.TranscriptSegment"
    segment_id: str
    call_id: str
    leg: Leg
    start_ms: int
    end_ms: int
    text: str
    is_final: bool
    confidence: float
    avg_logprob: float
    no_speech_prob: float
    model_name: str
    model_version: int
    redactions: int = 0
    first_frame_produced_at_ms: int = 0
    segment_closed_at_ms: int = 0
    batch_size: int = 1
    batcher_wait_ms: float = 0.0
    inference_ms: float = 0.0
    produced_at_ms: int = field(default_factory=now_ms)
    sentiment: float = 0.0  # of the redacted text, −5..+5 (pipeline/qa/sentiment.py); 0 for a partial
    revision: int = 0  # the pass that wrote it: 0 live, 1, 2, ... post-call passes (store migration 5)


@dataclass
class LatencyMetric(Message):
    SCHEMA: ClassVar[str] = "io.callqa.LatencyMetric"
    segment_id: str
    call_id: str
    leg: Leg
    is_final: bool
    frame_to_consume_ms: float
    batcher_wait_ms: float
    batch_size: int
    inference_ms: float
    end_to_end_ms: float
    worker_id: str = ""
    measured_at_ms: int = field(default_factory=now_ms)


@dataclass
class QaItem:
    question: str
    weight: float
    passed: bool
    rationale: str
    auto_fail: bool = False


@dataclass
class QaEvent:
    rule: str
    category: str
    leg: str
    kind: str
    offset_ms: int
    text: str
    severity: str = "info"


@dataclass
class CallHold:
    """A hold of a finished call, [start_ms, end_ms) on the call's clock."""

    start_ms: int
    end_ms: int


@dataclass
class CallQA(Message):
    SCHEMA: ClassVar[str] = "io.callqa.CallQA"
    call_id: str
    score_pct: float
    auto_failed: bool
    metrics: dict[str, float]
    items: list[QaItem]
    events: list[QaEvent]
    tenant: str = ""
    agent_id: str = ""
    scorecard: str = ""
    computed_at_ms: int = field(default_factory=now_ms)
    # The call-level figures the calls table keeps (−5..+5; 0 for a leg that never spoke).
    customer_sentiment: float = 0.0
    customer_sentiment_start: float = 0.0
    customer_sentiment_end: float = 0.0
    agent_sentiment_start: float = 0.0
    agent_sentiment_end: float = 0.0
    longest_monologue_ms: int = 0
    hold_ms: int = 0
    holds: list[CallHold] = field(default_factory=list)  # when: the intervals hold_ms is the total of
    paused_ms: int = 0  # secure pauses: capture paused on purpose, no audio (not hold time)
    pauses: list[CallHold] = field(default_factory=list)
    revision: int = 0  # the pass this result is of: 0 live, 1, 2, ... post-call passes (store migration 5)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CallQA:
        record = dict(record)
        record["items"] = [QaItem(**i) for i in record.get("items", [])]
        record["events"] = [QaEvent(**e) for e in record.get("events", [])]
        record["holds"] = [CallHold(**h) for h in record.get("holds", [])]
        record["pauses"] = [CallHold(**h) for h in record.get("pauses", [])]
        return super().from_record(record)


@dataclass
class QaAlert(Message):
    SCHEMA: ClassVar[str] = "io.callqa.QaAlert"
    call_id: str
    rule: str
    category: str
    leg: str
    kind: str
    offset_ms: int
    text: str
    severity: str = "warning"
    detected_at_ms: int = field(default_factory=now_ms)


@dataclass
class LiveCall(Message):
    """A call in progress as the live desk shows it (schemas/LiveCall.avsc): the newest per call on a compacted
    topic, a tombstone when it ended. Figures, never text: the turns themselves are on the transcripts topic."""

    SCHEMA: ClassVar[str] = "io.callqa.LiveCall"
    call_id: str
    started_at_ms: int
    updated_at_ms: int
    tenant: str = ""
    agent_id: str = ""
    queue: str = ""
    direction: str = "inbound"
    call_ms: int = 0
    agent_talk_ms: int = 0
    customer_talk_ms: int = 0
    silence_ms: int = 0
    turns: int = 0
    customer_sentiment: float = 0.0
    customer_trend: str = "steady"
    customer_scores: list[float] = field(default_factory=list)
    alerts: int = 0
    last_alert_rule: str = ""
    last_alert_severity: str = ""
    last_alert_ms: int = -1
    on_hold: bool = False


@dataclass
class DeadLetter(Message):
    """A reference to what failed (where, which call, leg and time range, why), not the data itself.

    ``raw`` and ``key`` stay None unless the worker runs with ``debug_raw_audio``: a dead letter is kept
    far longer than the audio topic, so by default it must hold neither audio nor message bytes.
    """

    SCHEMA: ClassVar[str] = "io.callqa.DeadLetter"
    original_topic: str
    original_partition: int
    original_offset: int
    reason: str
    raw: bytes | None = None
    key: bytes | None = None
    error_type: str = ""
    worker_id: str = ""
    failed_at_ms: int = field(default_factory=now_ms)
    call_id: str = ""
    leg: str = ""
    segment_id: str = ""
    start_ms: int = -1
    end_ms: int = -1
    raw_kind: str = ""  # "message", "pcm16le_16k" or "" (see schemas/DeadLetter.avsc)


@dataclass
class CheckpointSegment:
    segment_id: str
    leg: str
    start_ms: int
    end_ms: int
    text: str


@dataclass
class HoldSpan:
    start_ms: int
    end_ms: int


@dataclass
class LegCheckpoint:
    """One leg's audio path between two segments; arrays are float32 little-endian bytes. ``vad_context``'s
    size gives the VAD's rate: 64 samples at 16 kHz, 32 at 8 kHz (``vad_sample_rate``), and then
    ``vad_pending`` and ``audio`` are the leg's 8 kHz samples and the resampler fields only counters."""

    leg: str
    sample_rate: int
    encoding: str
    frame_ms: int
    next_seq: int
    frames_released: int
    samples_in: int
    samples_out: int
    resampler_history: bytes
    vad_state: bytes
    vad_context: bytes
    vad_pending: bytes
    windows_done: int
    last_end: int
    emitted: int
    audio_start: int
    audio: bytes
    # The keypad detector (pipeline/audio/dtmf.py ``KeypadSnapshot``): -1 when the record has none (written
    # before it, or with it off); the samples it held back (float32 bytes), where its analysis resumes, and
    # the leg's tones so far as [start, end) sample pairs, flat. No key: which one was typed is never kept.
    keypad_released: int = -1
    keypad_rescan: int = 0
    keypad_audio: bytes = b""
    keypad_spans: list[int] = field(default_factory=list)


CheckpointStatus = Literal["open", "closed", "finished"]


@dataclass
class CallCheckpoint(Message):
    """Worker-internal resume point of a call (see schemas/CallCheckpoint.avsc)."""

    SCHEMA: ClassVar[str] = "io.callqa.CallCheckpoint"
    call_id: str
    status: CheckpointStatus
    taken_at_ms: int = field(default_factory=now_ms)
    resume_offset: int = -1
    events_end_offset: int = -1  # finished: first events offset after the call's events (see the schema)
    has_start: bool = False
    started_at_ms: int = 0
    tenant: str = ""
    agent_id: str = ""
    queue: str = ""
    direction: str = "inbound"
    end_reason: str = ""
    segments_done: int = 0
    segments: list[CheckpointSegment] = field(default_factory=list)
    legs: list[LegCheckpoint] = field(default_factory=list)
    holds: list[HoldSpan] = field(default_factory=list)
    held_from_ms: int = -1
    resumed_at_ms: int = 0
    pauses: list[HoldSpan] = field(default_factory=list)  # secure pauses, kept as holds are
    paused_from_ms: int = -1
    published: list[str] = field(default_factory=list)  # outputs a replay from here must not publish again
    # What the stored text no longer says for redaction (qa.redaction.RedactionMemory): a whole card number
    # given, values said as words by digest ("MARKER:N:HEX").
    card_given: bool = False
    said_values: list[str] = field(default_factory=list)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CallCheckpoint:
        record = dict(record)
        record["segments"] = [CheckpointSegment(**s) for s in record.get("segments", [])]
        record["legs"] = [LegCheckpoint(**leg) for leg in record.get("legs", [])]
        record["holds"] = [HoldSpan(**h) for h in record.get("holds", [])]
        record["pauses"] = [HoldSpan(**h) for h in record.get("pauses", [])]
        return super().from_record(record)


@dataclass
class JobHold:
    start_ms: int
    end_ms: int


@dataclass
class JobCut:
    start_ms: int
    end_ms: int
    kind: str  # the marker the transcript put there: PAN, CVV, DOB, ...


@dataclass
class JobRedaction:
    """A final whose audio holds what its text redacts (pipeline/qa/redaction.py ``RedactedTurn``)."""

    leg: str
    start_ms: int
    end_ms: int
    digits_kept: int
    cuts: list[JobCut] = field(default_factory=list)


@dataclass
class JobKeypadTone:
    """A keypad tone found in a leg (pipeline/audio/dtmf.py): [start_ms, end_ms) on the leg's clock, no key."""

    leg: str
    start_ms: int
    end_ms: int


@dataclass
class PostCallJob(Message):
    """A finished call for the post-call pass (see schemas/PostCallJob.avsc): where its audio is on the
    audio topic, and what its revision rows keep from the live pass."""

    SCHEMA: ClassVar[str] = "io.callqa.PostCallJob"
    call_id: str
    revision: int
    model: str
    audio_topic: str
    audio_partition: int
    audio_from_ms: int
    audio_end_offset: int
    frame_counts: dict[str, int]
    tenant: str = ""
    agent_id: str = ""
    queue: str = ""
    direction: str = "inbound"
    started_at_ms: int = 0
    ended_at_ms: int = 0
    end_reason: str = ""
    audio_ms: int = 0
    holds: list[JobHold] = field(default_factory=list)
    pauses: list[JobHold] = field(default_factory=list)  # secure pauses, [start_ms, end_ms) on the call's clock
    live_score_pct: float = 0.0
    live_auto_failed: bool = False
    requested_at_ms: int = field(default_factory=now_ms)
    redacted: list[JobRedaction] = field(default_factory=list)
    keypad: list[JobKeypadTone] = field(default_factory=list)  # the call's keypad tones, silenced in its recording

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> PostCallJob:
        record = dict(record)
        record["holds"] = [JobHold(**h) for h in record.get("holds", [])]
        record["pauses"] = [JobHold(**h) for h in record.get("pauses", [])]
        record["redacted"] = [JobRedaction(**{**r, "cuts": [JobCut(**c) for c in r.get("cuts", [])]})
                              for r in record.get("redacted", [])]
        record["keypad"] = [JobKeypadTone(**t) for t in record.get("keypad", [])]
        return super().from_record(record)

    def hold_intervals(self) -> list[tuple[int, int]]:
        return [(h.start_ms, h.end_ms) for h in self.holds]

    def pause_intervals(self) -> list[tuple[int, int]]:
        return [(h.start_ms, h.end_ms) for h in self.pauses]


ALL_MESSAGES: tuple[type[Message], ...] = (
    AudioFrame, CallEvent, TranscriptSegment, LatencyMetric, CallQA, QaAlert, DeadLetter, CallCheckpoint,
    PostCallJob, LiveCall,
)
