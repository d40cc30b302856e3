"""The benchmarks' traffic sent to Kafka: the live benchmark's planned calls, and library calls replayed.

Planned calls (``LiveSender``) are sent in real time, as a media gateway sends them (a start event when a
call connects, both legs' μ-law audio as it happens, in messages of ``audio_message_ms``, keyed by call id, an end event after
the last frame). ``pipeline.ingest.replay.TelephonyReplay`` starts every call at once; here each call
starts at its own arrival time, so the pacing is a 20 ms tick over every open call (arrivals are on the
frame grid, so a frame is never held back to the next tick). The wall time of traffic time 0 is
recorded: a turn's last frame is due at that + the call's arrival + the turn's end, the reference its
final's latency is measured from. How late the ticks ran is recorded too (a late sender inflates every
latency).

Library calls (``replay``: scale-out, chaos, end-to-end) go through the product's own TelephonyReplay,
whole, so what the workers make of them can be checked against `callqa analyze` of the same files:
fast (a backlog), in real time, or fast up to a point and live from there.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench.traffic import FRAME_BYTES, FRAME_MS, RATE, CallPlan, NoiseBed, TurnLibrary, render_leg
from pipeline.broker.producer import DELIVERY_TIMEOUT_S, ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import LEGS, AudioFrame, CallEvent, now_ms
from pipeline.eval.call_library import LIBRARY_DIR, holds_of, load_manifest
from pipeline.ingest.replay import CallRecording, ReplayOptions, ReplayReport, TelephonyReplay, load_recording

TENANT = "bench"


@dataclass
class CallStream:
    """One call being sent: its legs' μ-law audio and the next frame; builds messages, sends nothing.
    A message holds ``message_frames`` 20 ms frames (``audio_message_ms``), sent once its last is due."""

    plan: CallPlan
    legs: dict[str, bytes] = field(repr=False)
    message_frames: int = 1
    next_frame: int = 0

    @classmethod
    def render(cls, plan: CallPlan, library: TurnLibrary, noise: NoiseBed, message_frames: int = 1) -> CallStream:
        return cls(plan, {leg: render_leg(plan, leg, library, noise) for leg in LEGS}, message_frames)

    @property
    def done(self) -> bool:
        return self.next_frame >= self.plan.frames

    @property
    def agent_id(self) -> str:
        return f"agent-{zlib.crc32(self.plan.call_id.encode()) % 100:02d}"

    @property
    def messages_sent(self) -> int:
        """Messages each leg got so far (the whole call's once done; the last one may be short)."""
        return -(-self.next_frame // self.message_frames)

    def start_event(self) -> CallEvent:
        return CallEvent(self.plan.call_id, "start", tenant=TENANT, agent_id=self.agent_id, queue="bench",
                         legs=list(LEGS), sample_rate=RATE, encoding="mulaw")

    def end_event(self) -> CallEvent:
        return CallEvent(self.plan.call_id, "end", tenant=TENANT, agent_id=self.agent_id, queue="bench",
                         legs=list(LEGS), sample_rate=RATE, encoding="mulaw",
                         frame_counts=dict.fromkeys(LEGS, self.messages_sent))

    def frames_until(self, end_frame: int) -> list[AudioFrame]:
        """Both legs' messages whose frames are all due before ``end_frame`` (the call's last message
        once its end is due), from the next one on."""
        messages = []
        produced = now_ms()
        n, total = self.message_frames, self.plan.frames
        while self.next_frame < min(end_frame, total):
            first, last = self.next_frame, min(self.next_frame + n, total)
            if last > end_frame:
                break  # the message's last frame is not due yet
            for leg, audio in self.legs.items():
                messages.append(AudioFrame(
                    call_id=self.plan.call_id, leg=leg,  # type: ignore[arg-type]
                    seq=first // n, start_ms=first * FRAME_MS, sample_rate=RATE, encoding="mulaw",
                    payload=audio[first * FRAME_BYTES:last * FRAME_BYTES], produced_at_ms=produced,
                ))
            self.next_frame = last
        return messages


@dataclass
class SendReport:
    """What was sent: the wall time of traffic time 0, per call whether it started and ended."""

    started_wall_s: float = 0.0
    started: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    frames_sent: int = 0
    events_sent: int = 0
    late_ms: list[float] = field(default_factory=list, repr=False)  # per tick: when sent - when due

    def lateness(self) -> dict[str, float]:
        if not self.late_ms:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        values = np.asarray(self.late_ms)
        return {"p50_ms": round(float(np.percentile(values, 50)), 1),
                "p99_ms": round(float(np.percentile(values, 99)), 1), "max_ms": round(float(values.max()), 1)}


class LiveSender:
    """Sends calls at their arrival times, in real time, through one producer."""

    def __init__(self, producer: ContractProducer, audio_topic: str, events_topic: str, library: TurnLibrary,
                 noise: NoiseBed, message_ms: int = FRAME_MS) -> None:
        self.producer = producer
        self.message_frames = max(1, message_ms // FRAME_MS)
        self.audio_topic = audio_topic
        self.events_topic = events_topic
        self.library = library
        self.noise = noise
        noise.data  # noqa: B018 - built now, not at the first call's arrival

    def run(self, plans: Sequence[CallPlan], until_s: float, stop: threading.Event,
            report: SendReport | None = None, on_tick: Callable[[float], None] | None = None,
            end_open: bool = False) -> SendReport:
        """Send until traffic time ``until_s`` (calls still open then just stop, as at a capture's end, or
        with ``end_open`` are ended there, so a turn that ended just before gets its final) or ``stop``.
        ``report`` is filled as it goes (others may read it while this runs)."""
        report = report or SendReport()
        pending = sorted(plans, key=lambda p: p.arrival_s)
        arrival_tick = {p.call_id: round(p.arrival_s * 1000 / FRAME_MS) for p in plans}
        active: list[CallStream] = []
        began = time.monotonic()
        report.started_wall_s = time.time() - (time.monotonic() - began)
        tick = 0
        while tick * FRAME_MS / 1000 <= until_s:
            due = began + tick * FRAME_MS / 1000
            if stop.wait(max(0.0, due - time.monotonic())):
                break
            while pending and arrival_tick[pending[0].call_id] <= tick:
                active.append(self._start(pending.pop(0), report))
            for stream in active:
                self._send_frames(stream, tick - arrival_tick[stream.plan.call_id], report)
            active = [s for s in active if not s.done]
            report.late_ms.append((time.monotonic() - due) * 1000)
            if on_tick is not None:
                on_tick(tick * FRAME_MS / 1000)
            tick += 1
        if end_open:
            for stream in active:
                self._end(stream, report)
        self.producer.flush(DELIVERY_TIMEOUT_S)
        return report

    def _start(self, plan: CallPlan, report: SendReport) -> CallStream:
        stream = CallStream.render(plan, self.library, self.noise, self.message_frames)
        self.producer.send(self.events_topic, plan.call_id, stream.start_event())
        report.events_sent += 1
        report.started.add(plan.call_id)
        return stream

    def _send_frames(self, stream: CallStream, frames_due: int, report: SendReport) -> None:
        for frame in stream.frames_until(frames_due):
            self.producer.send(self.audio_topic, stream.plan.call_id, frame)
            report.frames_sent += 1
        if stream.done:
            self._end(stream, report)

    def _end(self, stream: CallStream, report: SendReport) -> None:
        self.producer.send(self.events_topic, stream.plan.call_id, stream.end_event())
        report.events_sent += 1
        report.ended.add(stream.plan.call_id)


# ---- library calls, replayed whole ---------------------------------------------------------------------
REPLAY = ReplayOptions(encoding="mulaw", frame_ms=FRAME_MS)
# Longer library calls are left out of loads made of whole calls, so no single call's tail decides when a
# run ends.
MAX_LOAD_CALL_MS = 100_000


def library_calls(names: tuple[str, ...] = (), max_ms: int = MAX_LOAD_CALL_MS,
                  holds: bool = True) -> list[tuple[dict[str, Any], Path]]:
    """(manifest entry, file) of the library calls ``names``, else of every call up to ``max_ms`` long
    (``holds`` False: those with holds left out), in manifest order."""
    calls = load_manifest()["calls"]
    if names:
        by_id = {c["id"]: c for c in calls}
        calls = [by_id[name] for name in names]
    else:
        calls = [c for c in calls if c["duration_ms"] <= max_ms and (holds or not c["holds"])]
    return [(c, LIBRARY_DIR / c["file"]) for c in calls]


def load_call(call: dict[str, Any], path: Path) -> CallRecording:
    """A library call ready to replay, its holds honoured (no frames are sent there)."""
    rec = load_recording(path, REPLAY)
    rec.holds_ms = holds_of(call)
    return rec


def load_library(max_ms: int = MAX_LOAD_CALL_MS) -> list[CallRecording]:
    """The library calls up to ``max_ms`` long, ready to replay, in manifest order."""
    return [load_call(call, path) for call, path in library_calls(max_ms=max_ms)]


def call_s(rec: CallRecording) -> float:
    """A call's length: its longest leg's frames."""
    frame = rec.sample_rate * FRAME_MS // 1000
    return max(rec.frame_count(leg, frame) for leg in rec.legs) * FRAME_MS / 1000


def leg_audio_s(rec: CallRecording) -> float:
    """The audio of all of a call's legs (what the workers' segmenters are fed once)."""
    frame = rec.sample_rate * FRAME_MS // 1000
    return sum(rec.frame_count(leg, frame) for leg in rec.legs) * FRAME_MS / 1000


def replay(settings: Settings, calls: list[tuple[str, CallRecording]], live_from_s: float | None = 0.0,
           on_live: Callable[[], None] | None = None, stop: threading.Event | None = None) -> ReplayReport:
    """Send the calls with the ids given, all starting now: the first ``live_from_s`` seconds of the calls'
    time as fast as possible, the rest in real time (None: all fast; 0: all in real time), ``on_live``
    called before the real-time part, which begins when it returns; ``stop`` aborts the calls."""
    player = TelephonyReplay(ContractProducer.from_settings(settings, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)
    options = replace(REPLAY, calls=len(calls), frame_ms=settings.audio_message_ms)  # as a gateway sends them
    return player.run([rec for _, rec in calls], options,
                      call_ids=[call_id for call_id, _ in calls], live_from_s=live_from_s, on_live=on_live, stop=stop)
