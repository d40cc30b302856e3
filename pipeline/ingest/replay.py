"""Telephony replay: recordings in, call events and per-leg audio frames out, as a media gateway sends them.

A stereo recording is one call (left = agent, right = customer); a mono recording is one leg. Each
call gets a start event, then its legs' frames in time order (keyed by call ID, so a call stays on one
partition), then an end event carrying the frame counts. If anything goes wrong mid-way, every call
that was started gets an ``abort`` event, so no consumer waits forever for an end that never comes.
"""

from __future__ import annotations

import heapq
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError, LoadedAudio, load_audio
from pipeline.audio.resample import resample
from pipeline.broker.producer import DELIVERY_TIMEOUT_S, ContractProducer
from pipeline.contracts.messages import LEGS, AudioFrame, CallEvent, Encoding, Leg, now_ms

TELEPHONY_RATE = 8000


@dataclass(frozen=True)
class ReplayOptions:
    frame_ms: int = 20
    encoding: Encoding = "mulaw"
    realtime: bool = False
    calls: int = 0  # 0: one call per input file
    mono_leg: Leg = "agent"
    call_id_prefix: str = "call"
    tenant: str = ""  # "": the worker's CALLQA_DEFAULT_TENANT
    queue: str = "support"


@dataclass
class CallRecording:
    """One call's legs, already at the telephony rate and encoding, ready to be cut into frames."""

    source: str
    legs: dict[str, np.ndarray]  # leg -> float32 samples at `sample_rate`
    sample_rate: int
    encoded: dict[str, bytes] = field(default_factory=dict)  # leg -> whole leg in the replay encoding
    # (start_ms, end_ms) ranges where the call is on hold: no frame of either leg is sent there, as a
    # gateway that stops the media stream (the worker fills the gap with silence when frames resume).
    holds_ms: list[tuple[int, int]] = field(default_factory=list)

    def encode(self, encoding: str) -> None:
        # Encoding each leg once and slicing bytes per frame is exact for G.711 and PCM16
        # (sample-wise codecs) and keeps the hot loop to framing and producing.
        self.encoded = {leg: codecs.encode(x, encoding) for leg, x in self.legs.items()}

    def frame_count(self, leg: str, frame_samples: int) -> int:
        n = len(self.legs[leg])
        return -(-n // frame_samples)

    def on_hold(self, start_ms: int, end_ms: int) -> bool:
        """Whether the frame [start_ms, end_ms) lies wholly inside a hold."""
        return any(h_start <= start_ms and end_ms <= h_end for h_start, h_end in self.holds_ms)


@dataclass
class ReplayReport:
    call_ids: list[str] = field(default_factory=list)
    frames_per_leg: dict[str, dict[str, int]] = field(default_factory=dict)
    frames_sent: int = 0
    events_sent: int = 0
    elapsed_s: float = 0.0

    @property
    def frames_per_s(self) -> float:
        return self.frames_sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


def load_recording(path: str | Path, options: ReplayOptions) -> CallRecording:
    """Read a file (any format ``load_audio`` reads) and bring it to the telephony rate; raises
    AudioFileError naming the file."""
    audio: LoadedAudio = load_audio(path)
    if audio.channels > 2:
        raise AudioFileError(path, f"{audio.channels} channels: a call is mono (one leg) or stereo "
                                   "(left agent, right customer)")
    rate = TELEPHONY_RATE if options.encoding != "pcm16" else min(audio.sample_rate, 16000)
    legs: dict[str, np.ndarray]
    if audio.channels == 1:
        legs = {options.mono_leg: audio.samples[0]}
    else:
        legs = {"agent": audio.samples[0], "customer": audio.samples[1]}
    legs = {leg: resample(x, audio.sample_rate, rate).astype(np.float32) for leg, x in legs.items()}
    rec = CallRecording(source=str(path), legs=legs, sample_rate=rate)
    rec.encode(options.encoding)
    return rec


@dataclass(order=True)
class _Due:
    at_s: float
    order: int
    send: Callable[[], None] = field(compare=False)
    frames: int = field(compare=False, default=0)


class TelephonyReplay:
    """Replays recordings as N concurrent calls through one idempotent producer."""

    def __init__(self, producer: ContractProducer, audio_topic: str, events_topic: str) -> None:
        self.producer = producer
        self.audio_topic = audio_topic
        self.events_topic = events_topic

    def run(
        self,
        recordings: list[CallRecording],
        options: ReplayOptions,
        on_frames: Callable[[int], None] | None = None,
        *,
        call_ids: list[str] | None = None,
        live_from_s: float | None = None,
        on_live: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> ReplayReport:
        """Send the calls; returns what was sent.

        Pacing: ``options.realtime`` sends every frame when its audio has happened; ``live_from_s``
        sends the calls' first ``live_from_s`` seconds as fast as possible (a backlog), then the rest in
        real time. ``on_live`` is called once the backlog is on the broker; the real-time part begins
        when it returns (it may hold it back, e.g. until the consumers have read the backlog). ``call_ids``
        names the calls (one per call; default: prefix, a run id and a number); ``stop`` aborts the
        replay (RuntimeError), and every call started gets its abort event.
        """
        n_calls = options.calls or len(recordings)
        run_id = uuid.uuid4().hex[:6]
        ids = call_ids or [f"{options.call_id_prefix}-{run_id}-{i:04d}" for i in range(n_calls)]
        if len(ids) != n_calls:
            raise ValueError(f"{len(ids)} call ids for {n_calls} calls")
        calls = [(ids[i], recordings[i % len(recordings)]) for i in range(n_calls)]
        live_from = 0.0 if options.realtime else (float("inf") if live_from_s is None else live_from_s)
        live_at: float | None = None
        report = ReplayReport(call_ids=[c for c, _ in calls])
        open_calls: set[str] = set()
        began = time.monotonic()
        try:
            queue: list[_Due] = []
            order = 0
            for call_id, rec in calls:
                for due in self._call_schedule(call_id, rec, options, report, open_calls):
                    due.order = order
                    order += 1
                    queue.append(due)
            heapq.heapify(queue)
            while queue:
                item = heapq.heappop(queue)
                if item.at_s >= live_from:
                    if live_at is None:
                        # The backlog is on the broker before the live part begins.
                        self.producer.flush(DELIVERY_TIMEOUT_S)
                        if on_live is not None:
                            on_live()
                        live_at = time.monotonic()
                    wait = max(0.0, live_at + item.at_s - live_from - time.monotonic())
                    if stop is not None:
                        if stop.wait(wait):
                            raise RuntimeError("replay stopped")
                    elif wait > 0:
                        time.sleep(wait)
                item.send()
                report.frames_sent += item.frames
                if item.frames and on_frames is not None:
                    on_frames(item.frames)
            # As long as librdkafka may still deliver: a call's end event, queued while the broker restarted,
            # was lost when this gave up after 60 s (the chaos test on busy cores).
            self.producer.flush(DELIVERY_TIMEOUT_S)
        finally:
            for call_id in sorted(open_calls):  # only reached on error: close what we opened
                self.producer.send(
                    self.events_topic, call_id,
                    CallEvent(call_id, "abort", tenant=options.tenant, reason="replay interrupted"),
                )
                report.events_sent += 1
            if open_calls:
                self.producer.flush(10.0)
        report.elapsed_s = time.monotonic() - began
        return report

    def _call_schedule(
        self, call_id: str, rec: CallRecording, options: ReplayOptions, report: ReplayReport, open_calls: set[str]
    ) -> Iterator[_Due]:
        """Start event at t=0, each frame when its audio has 'happened', end event after the last."""
        frame_samples = rec.sample_rate * options.frame_ms // 1000
        legs: list[str] = [leg for leg in LEGS if leg in rec.legs]
        counts = {leg: rec.frame_count(leg, frame_samples) for leg in legs}
        report.frames_per_leg[call_id] = counts
        start = CallEvent(
            call_id, "start", tenant=options.tenant, agent_id=f"agent-{zlib.crc32(rec.source.encode()) % 100:02d}",
            queue=options.queue, legs=list(legs), sample_rate=rec.sample_rate, encoding=options.encoding,
        )

        def send_start() -> None:
            open_calls.add(call_id)
            self.producer.send(self.events_topic, call_id, start)
            report.events_sent += 1

        yield _Due(0.0, 0, send_start)
        n_frames = max(counts.values())
        yield from self._hold_changes(call_id, rec, start, n_frames * options.frame_ms, report)
        for k in range(n_frames):
            if rec.on_hold(k * options.frame_ms, (k + 1) * options.frame_ms):
                continue
            # A frame is sent once its audio has been captured, i.e. at the end of the frame.
            yield _Due((k + 1) * options.frame_ms / 1000, 0, self._frame_sender(call_id, rec, legs, k, options),
                       frames=sum(1 for leg in legs if k < counts[leg]))

        def send_end() -> None:
            # A call's frames and its end event are on two topics, and Kafka keeps order per partition only:
            # after a broker restart a producer's queues drain in any order, and an end read before the
            # call's last frames closed the call without them (end_wait_max_s later: the chaos test lost
            # half a call so). The end goes out once every frame before it is on the broker.
            self.producer.flush(DELIVERY_TIMEOUT_S)
            end = CallEvent(
                call_id, "end", tenant=options.tenant, agent_id=start.agent_id, queue=options.queue,
                legs=list(legs), sample_rate=rec.sample_rate, encoding=options.encoding, frame_counts=counts,
            )
            self.producer.send(self.events_topic, call_id, end)
            report.events_sent += 1
            open_calls.discard(call_id)

        yield _Due((n_frames + 1) * options.frame_ms / 1000, 0, send_end)

    def _hold_changes(self, call_id: str, rec: CallRecording, start: CallEvent, call_ms: int,
                      report: ReplayReport) -> Iterator[_Due]:
        """A hold event when each hold begins and a resume when it ends (within the call), as a gateway
        sends them for a PCI pause: the worker keeps the call open through it and measures it."""
        for h_start, h_end in sorted(rec.holds_ms):
            if h_start >= call_ms or h_end <= h_start:
                continue
            for kind, at in (("hold", h_start), ("resume", min(h_end, call_ms))):
                event = CallEvent(call_id, kind, tenant=start.tenant, agent_id=start.agent_id,  # type: ignore[arg-type]
                                  queue=start.queue, legs=list(start.legs), offset_ms=at)

                def send(event: CallEvent = event) -> None:
                    event.at_ms = now_ms()
                    self.producer.send(self.events_topic, call_id, event)
                    report.events_sent += 1

                yield _Due(at / 1000, 0, send)

    def _frame_sender(
        self, call_id: str, rec: CallRecording, legs: list[str], k: int, options: ReplayOptions
    ) -> Callable[[], None]:
        frame_bytes = rec.sample_rate * options.frame_ms // 1000 * codecs.bytes_per_sample(options.encoding)

        def send() -> None:
            for leg in legs:
                payload = rec.encoded[leg][k * frame_bytes:(k + 1) * frame_bytes]
                if not payload:
                    continue
                frame = AudioFrame(
                    call_id=call_id, leg=leg,  # type: ignore[arg-type]
                    seq=k, start_ms=k * options.frame_ms, sample_rate=rec.sample_rate,
                    encoding=options.encoding, payload=payload, produced_at_ms=now_ms(),
                )
                self.producer.send(self.audio_topic, call_id, frame)

        return send
