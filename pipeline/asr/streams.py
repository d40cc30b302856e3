"""The streaming verbs: legs' audio in; each leg's finals and its open segment's partial out; the ready legs
decoded together, in one batch.

The shape of sherpa-onnx's online recogniser, on ``Engine``:

    streams = {leg: engine.create_stream(sample_rate=8000, encoding="mulaw") for leg in legs}
    streams[leg].accept_waveform(frame)                  # a leg's frame bytes (or float samples) as they come
    while ready := [s for s in streams.values() if engine.is_ready(s)]:
        engine.decode_streams(ready)                     # one batch: closed segments first, then partials
    result = engine.get_result(streams[leg])             # its new finals, and the open segment's text so far
    streams[leg].input_finished()                        # the leg ended: its last segment closes

A stream is ready while a closed segment of it waits (its final), or, with ``partial_interval_ms`` > 0,
when its open segment has grown by that much since its last partial. ``decode_streams`` takes one
closed segment per stream (a leg's next segment is decoded after its previous text, ``LegContext``), so
``while is_ready: decode_streams`` is the loop; finals fill the batch (``max_batch``) before partials, and
a partial that finds no room waits for the next call: under load, partials give way.

The worker's async path is this flow with the scheduling in ``SegmentBatcher`` (finals first, previews
bounded and dropped when stale, across processes); this module is the same flow for synchronous callers.
Moonshine's and Whisper's encoders see a whole segment, so a partial decodes the open segment from its
start; the long-turn rule (``long_segment_ms``) keeps that short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.asr.context import LegContext
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, SegmentAudio, TranscriptResult
from pipeline.segmentation import SpeechSegment
from pipeline.segmentation.segmenter import Segmenter


class FrontEnd(Protocol):
    """A leg's audio path to closed segments (``engine.LegFrontEnd``)."""

    @property
    def segmenter(self) -> Segmenter: ...

    def accept(self, payload: bytes) -> list[SpeechSegment]: ...

    def accept_samples(self, samples: np.ndarray) -> list[SpeechSegment]: ...

    def finish(self) -> list[SpeechSegment]: ...


@dataclass(frozen=True)
class StreamResult:
    """What ``get_result`` hands back: the finals decoded since it was last asked, in order, and the text of
    the open segment's latest partial ("" when none is open or it has none yet)."""

    finals: tuple[TranscriptResult, ...] = ()
    partial: str = ""


@dataclass(eq=False)  # a stream is itself: compared and hashed by identity
class LegStream:
    """One leg on its way to text (sherpa's online stream): made by ``Engine.create_stream``."""

    front_end: FrontEnd
    context: LegContext = field(default_factory=LegContext)
    closed: list[SpeechSegment] = field(default_factory=list)  # waiting for their finals, in order
    finals: list[TranscriptResult] = field(default_factory=list)  # decoded, not yet taken by get_result
    partial: str = ""
    partial_of: tuple[int, int] = (-1, 0)  # (segment start, its length in ms) the partial was decoded from
    finished: bool = False

    def accept_waveform(self, audio: bytes | np.ndarray) -> None:
        """Take the leg's next audio: frame bytes in the stream's encoding, or float samples at its rate."""
        if self.finished:
            raise ValueError("this stream's input is finished: open another for more audio")
        segments = self.front_end.accept(audio) if isinstance(audio, bytes) else self.front_end.accept_samples(audio)
        self._take(segments)

    def input_finished(self) -> None:
        """The leg has ended: its open segment closes (and waits for its final like the others)."""
        if not self.finished:
            self.finished = True
            self._take(self.front_end.finish())

    def _take(self, segments: list[SpeechSegment]) -> None:
        self.closed.extend(segments)
        if segments and self.front_end.segmenter.open_segment_start_ms != self.partial_of[0]:
            self.partial = ""  # its segment closed: the final supersedes the partial

    def partial_due(self, interval_ms: int) -> tuple[int, int] | None:
        """(start, length) in ms of the open segment when it has grown by ``interval_ms`` since its last
        partial; None when no partial is due (none open, partials off, or not grown enough)."""
        segmenter = self.front_end.segmenter
        start, length = segmenter.open_segment_start_ms, segmenter.open_segment_ms
        if interval_ms <= 0 or start is None or length is None:
            return None
        before = self.partial_of[1] if self.partial_of[0] == start else 0
        return (start, length) if length - before >= interval_ms else None


@dataclass(frozen=True)
class _Work:
    stream: LegStream
    segment: SegmentAudio
    final: bool


class StreamDecoder:
    """``decode_streams`` and its rules for one recogniser: at most ``max_batch`` segments a batch, finals
    before partials, partials every ``partial_interval_ms`` of an open segment's growth (0: none)."""

    def __init__(self, recognizer: Recognizer, max_batch: int, partial_interval_ms: int, context: bool) -> None:
        self.recognizer = recognizer
        self.max_batch = max(1, max_batch)
        self.partial_interval_ms = partial_interval_ms
        self.context = context

    def is_ready(self, stream: LegStream) -> bool:
        return bool(stream.closed) or stream.partial_due(self.partial_interval_ms) is not None

    def decode(self, streams: Sequence[LegStream]) -> None:
        """Decode the ready streams' work as one batch; raise the first failed final's error once every other
        stream has its result (that segment is dropped, so the stream goes on)."""
        work = [_Work(s, s.closed[0], True) for s in dict.fromkeys(streams) if s.closed][: self.max_batch]
        for stream in dict.fromkeys(streams):
            if len(work) >= self.max_batch:
                break  # no room left: the partials wait (finals first)
            due = None if stream.closed else stream.partial_due(self.partial_interval_ms)
            if due is not None:
                audio = stream.front_end.segmenter.open_segment_audio()
                assert audio is not None
                stream.partial_of = due
                work.append(_Work(stream, AudioSegment(due[0], due[0] + due[1], audio), False))
        if not work:
            return
        contexts = [w.stream.context.for_segment(w.segment.start_ms) if self.context else () for w in work]
        outcomes = self.recognizer.recognize([w.segment for w in work], contexts=contexts)
        failed: Exception | None = None
        for w, outcome in zip(work, outcomes, strict=True):
            if w.final:
                w.stream.closed.pop(0)
            if isinstance(outcome, Exception):
                failed = failed if failed is not None or not w.final else outcome  # a partial only waits
                continue
            if not w.final:
                w.stream.partial = "" if outcome.is_silence else outcome.text.strip()
                continue
            w.stream.context.update(outcome, w.segment.end_ms)
            if not outcome.is_silence:
                w.stream.finals.append(outcome)
        if failed is not None:
            raise failed

    @staticmethod
    def result(stream: LegStream) -> StreamResult:
        finals, stream.finals = tuple(stream.finals), []
        return StreamResult(finals, stream.partial)
