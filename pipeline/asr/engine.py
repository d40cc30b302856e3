"""The engine API: load a model, turn telephony frames or files into transcripts.

    engine = Engine.load()                               # builds the ONNX model on first use
    stream = engine.create_stream(sample_rate=8000, encoding="mulaw")
    for frame in frames:
        stream.accept_waveform(frame)
        while engine.is_ready(stream):                   # many streams: decode_streams(the ready ones)
            engine.decode_streams([stream])
        for result in engine.get_result(stream).finals:  # finals of segments that closed
            print(result.start_ms, result.text)
    stream.input_finished()                              # then decode and get_result once more
    engine.transcribe_file("call.wav")

The streaming verbs (sherpa-onnx's shape) are in pipeline/asr/streams.py.

The async worker uses the pieces separately: `engine.open_front_end(...)` per leg (decode, resample,
segment) and one `engine.new_batcher()` shared by every leg of the process.

An 8 kHz leg with ``vad_sample_rate`` 8000 is not resampled here: its segmenter takes the 8 kHz samples,
scores them at 8 kHz and upsamples only its segments' audio (pipeline/segmentation/segmenter.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import gcd
from pathlib import Path

import numpy as np

from pipeline.asr.batcher import SegmentBatcher, inference_processes
from pipeline.asr.canary import load_checked
from pipeline.asr.context import LegContext
from pipeline.asr.manifest import Manifest, ModelNotBuiltError, latest_model_folder
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import SegmentAudio, TranscriptResult
from pipeline.asr.streams import LegStream, StreamDecoder, StreamResult
from pipeline.audio import codecs
from pipeline.audio.dtmf import KeypadDetector, KeypadSnapshot, ToneSpan
from pipeline.audio.files import load_audio
from pipeline.audio.mel import SAMPLE_RATE
from pipeline.audio.resample import ResamplerSnapshot, StreamResampler
from pipeline.config import Settings, get_settings
from pipeline.segmentation import Segmenter, SpeechSegment, load_vad
from pipeline.segmentation.segmenter import SegmenterSnapshot, Silence

FILE_CHUNK_S = 1.0


class LegFrontEnd:
    """One leg's audio path: bytes (or samples) at any rate -> 16 kHz -> closed SpeechSegments. An 8 kHz
    leg with ``vad_sample_rate`` 8000 goes to its segmenter at 8 kHz (VAD at 8 kHz, segments at 16 kHz).

    Keypad tones (``keypad_tones``) are silenced first, at the leg's own rate, so neither the VAD nor the
    recogniser ever hears one; the detector holds its input back 66-100 ms (longer while a tone may be under
    way) to decide before it lets it through, and lets everything out at a long gap and at the leg's end."""

    def __init__(self, sample_rate: int, encoding: str, settings: Settings) -> None:
        codecs.bytes_per_sample(encoding)  # rejects an unknown encoding now, not at the first frame
        self.sample_rate = sample_rate
        self.encoding = encoding
        self._settings = settings
        self._keypad = KeypadDetector(sample_rate) if settings.keypad_tones else None
        self._set_input_rate(sample_rate if sample_rate == settings.vad_sample_rate == 8000 else SAMPLE_RATE)

    def _set_input_rate(self, rate: int) -> None:
        """The segmenter takes the leg's samples at ``rate``: 16 kHz (resampled here) or the leg's 8 kHz."""
        self._resampler = StreamResampler(self.sample_rate, rate)
        self._segmenter = Segmenter(self._settings, vad=load_vad(self._settings.vad_model_path), input_rate=rate)

    @property
    def segmenter(self) -> Segmenter:
        return self._segmenter

    def accept(self, payload: bytes) -> list[SpeechSegment]:
        """Take encoded frame bytes; the segments that closed."""
        return self.accept_samples(codecs.decode(payload, self.encoding))

    def accept_samples(self, samples: np.ndarray) -> list[SpeechSegment]:
        """Take float samples at the leg's rate; the segments that closed."""
        return self._segmenter.accept(self.to_segmenter(samples))

    @property
    def keypad_tones(self) -> list[ToneSpan]:
        """The leg's keypad tones so far, on its clock: when, never which key."""
        return self._keypad.spans if self._keypad is not None else []

    def to_segmenter(self, samples: np.ndarray) -> np.ndarray:
        """The resampling half of ``accept_samples``: the samples at the segmenter's ``input_rate`` (16 kHz,
        or the leg's own 8 kHz ones), keypad tones silenced, as far as the keypad detector lets them out;
        callers that batch the VAD over many legs (``segmentation.accept_many``) feed the segmenter themselves."""
        if self._keypad is not None:
            samples = self._keypad.process(samples)
        return self._resampler.process(samples)

    def silence_to_segmenter(self, samples: int) -> list[np.ndarray | Silence]:
        """``to_segmenter(np.zeros(samples))`` without making the zeros: what the resampler gives for
        ``samples`` zero samples at the leg's rate, with its runs of zeros given by their length (the
        segmenter's ``take``). A 20-minute gap costs what 0.1 s costs here. What the keypad detector held
        goes first; the gap's zeros pass it by (no tone is in digital silence), its clock moving past them."""
        out: list[np.ndarray | Silence] = []
        if self._keypad is not None and (held := self._keypad.skip(samples)).size:
            out.append(self._resampler.process(held))
        if self.sample_rate == self._segmenter.input_rate:  # nothing resampled: the run as it is
            self._resampler.samples_in += samples
            self._resampler.samples_out += samples
            return out + ([Silence(samples)] if samples else [])
        head = min(samples, max(1, self.sample_rate // 10))  # flushes the filter's memory of earlier input
        out.append(self._resampler.process(np.zeros(head, dtype=np.float32)))
        rest = samples - head
        snap = self._resampler.snapshot()
        if rest and not snap.history.any():
            # Its input since the last outputs' first taps is all zeros: each ``down`` more zero samples
            # are exactly ``up`` more zero outputs and leave it as it is, but for its counters.
            g = gcd(self.sample_rate, SAMPLE_RATE)
            up, down = SAMPLE_RATE // g, self.sample_rate // g
            skipped = rest - rest % down
            self._resampler = StreamResampler.restored(self.sample_rate, SAMPLE_RATE, ResamplerSnapshot(
                snap.samples_in + skipped, snap.samples_out + skipped * up // down, snap.history))
            out.append(Silence(skipped * up // down))
            rest -= skipped
        if rest:
            out.append(self._resampler.process(np.zeros(rest, dtype=np.float32)))
        return [a for a in out if isinstance(a, Silence) or a.size]

    def finish(self) -> list[SpeechSegment]:
        """End of the leg: the last segments."""
        held = self._keypad.flush() if self._keypad is not None else np.zeros(0, dtype=np.float32)
        closed = self._segmenter.accept(self._resampler.process(held)) if held.size else []
        return closed + self._segmenter.accept(self._resampler.flush()) + self._segmenter.flush()

    def snapshot(self) -> tuple[ResamplerSnapshot, SegmenterSnapshot, KeypadSnapshot | None]:
        """Where this leg's audio path stands, between segments (a call checkpoint holds it): the resampler,
        the segmenter, and the keypad detector (the samples it holds back, the tones so far; None when off)."""
        keypad = self._keypad.snapshot() if self._keypad is not None else None
        return self._resampler.snapshot(), self._segmenter.snapshot(), keypad

    def restore(self, resampler: ResamplerSnapshot, segmenter: SegmenterSnapshot,
                keypad: KeypadSnapshot | None = None) -> None:
        """Go on from a snapshot: the next samples continue the same stream of segments. The leg goes on
        at the VAD rate it was snapshotted at, whatever ``vad_sample_rate`` says now (so a snapshot from
        before 8 kHz VAD, or from a worker set otherwise, continues exactly). A keypad detector's state goes
        on too, whatever ``keypad_tones`` says now (the samples it held are in it). A snapshot without one
        (taken before detection existed) starts a detector where the leg's audio is: a tone under way
        then may go unnoticed, nothing else changes."""
        if keypad is not None:
            self._keypad = KeypadDetector.restored(self.sample_rate, keypad)
        elif self._keypad is not None:
            self._keypad = KeypadDetector.at(self.sample_rate, resampler.samples_in)
        rate = segmenter.input_rate
        if rate != SAMPLE_RATE and rate != self.sample_rate:
            raise ValueError(f"a leg snapshotted with its segmenter at {rate} Hz does not restore at {self.sample_rate} Hz")
        if rate != self._segmenter.input_rate:
            self._set_input_rate(rate)
        self._resampler = StreamResampler.restored(self.sample_rate, rate, resampler)
        self._segmenter.restore(segmenter)


def _build(name: str, models_dir: Path) -> Path:
    # Imported here: building pulls in onnx, whose ml_dtypes costs ~0.8 CPU-s at import, and a worker or an
    # inference process that finds its model built (every start but a machine's first) never needs it.
    from pipeline.asr.build import build_model

    return build_model(name, models_dir).folder


class Engine:
    def __init__(self, recognizer: Recognizer | None, settings: Settings, folder: Path | None = None) -> None:
        """``recognizer``: a loaded model version; or None, and it is loaded (and checked) from ``folder``
        when first needed (``Engine.load(..., defer=True)``)."""
        self._recognizer = recognizer
        self._folder = folder
        self.settings = settings
        self._streams: StreamDecoder | None = None

    @property
    def recognizer(self) -> Recognizer:
        """The model version in this process, loaded and checked (canary included) on first use."""
        if self._recognizer is None:
            self._recognizer = load_checked(self.folder, self.settings)
        return self._recognizer

    @property
    def folder(self) -> Path:
        """The model version's folder."""
        if self._folder is not None:
            return self._folder
        if self._recognizer is None:
            raise ValueError("this Engine has no model: neither a recognizer nor a folder to load one from")
        return Path(self._recognizer.model.folder)

    @classmethod
    def load(cls, name: str | None = None, *, settings: Settings | None = None, build: bool = True,
             defer: bool = False) -> Engine:
        """Load the newest built version of `name` (default: settings.model), building it if missing or
        built for another graph format. Refuses it (ModelIntegrityError, one line naming the folder)
        when a file or, with a trusted key set, the signature does not check out, or the canary fails.

        ``defer``: only find (or build) the folder; the model is loaded where it first decodes. A worker
        with inference processes so loads it only in those, which check it as this would (one load and
        canary at start, not two: about a second of a restart on one core, and one copy of the weights)."""
        settings = settings or get_settings()
        name = name or settings.model
        models_dir = Path(settings.models_dir)
        try:
            folder = latest_model_folder(models_dir, name)
            if not Manifest.read(folder).format_current and build:
                folder = _build(name, models_dir)  # built by an older callqa: next version
        except ModelNotBuiltError:
            if not build:
                raise
            folder = _build(name, models_dir)
        return cls(None if defer else load_checked(folder, settings), settings, folder)

    @property
    def model_label(self) -> str:
        return self.recognizer.model.label

    def new_batcher(self) -> SegmentBatcher:
        """A batcher for the async worker (call `await batcher.start()` inside its event loop). With
        ``inference_processes`` > 0 (or auto, on 2+ cores) its batches are decoded by that many child
        processes (started here, stopped by ``await batcher.close()``), off this process's GIL."""
        processes = inference_processes(self.settings.inference_processes)
        if processes > 0:
            from pipeline.asr.inference_process import process_batcher

            return process_batcher(self.folder, self.settings.model_copy(update={"inference_processes": processes}),
                                   self._recognizer)
        return SegmentBatcher.from_settings(self.recognizer, self.settings)

    def open_front_end(self, sample_rate: int = 8000, encoding: str = "mulaw") -> LegFrontEnd:
        return LegFrontEnd(sample_rate, encoding, self.settings)

    def create_stream(self, sample_rate: int = 8000, encoding: str = "mulaw") -> LegStream:
        """A leg's stream: ``accept_waveform`` its audio, ``input_finished`` at its end (streams.py)."""
        return LegStream(self.open_front_end(sample_rate, encoding), LegContext())

    def is_ready(self, stream: LegStream) -> bool:
        """Whether ``stream`` has a closed segment to decode, or a partial due (``partial_interval_ms``)."""
        return self._stream_decoder().is_ready(stream)

    def decode_streams(self, streams: Sequence[LegStream]) -> None:
        """Decode the streams' ready work in one batch: a closed segment of each first, then partials."""
        self._stream_decoder().decode(streams)

    def get_result(self, stream: LegStream) -> StreamResult:
        """The stream's finals decoded since last asked, and its open segment's partial text."""
        return StreamDecoder.result(stream)

    def is_endpoint(self, stream: LegStream) -> bool:
        """Whether a segment of ``stream`` reached its endpoint and its final waits for ``get_result``."""
        return bool(stream.finals)

    def _stream_decoder(self) -> StreamDecoder:
        if self._streams is None:
            s = self.settings
            self._streams = StreamDecoder(self.recognizer, s.max_batch, s.partial_interval_ms, s.context_tokens > 0)
        return self._streams

    def transcribe_segments(
        self, segments: Sequence[SegmentAudio], *, keep_silence: bool = False
    ) -> list[TranscriptResult]:
        """Decode segments now, in batches of max_batch; raises the first segment's error, if any."""
        results: list[TranscriptResult] = []
        step = max(1, self.settings.max_batch)
        for i in range(0, len(segments), step):
            for slot in self.recognizer.recognize(segments[i : i + step]):
                if isinstance(slot, Exception):
                    raise slot
                if keep_silence or not slot.is_silence:
                    results.append(slot)
        return results

    def leg_segments(self, samples: np.ndarray, sample_rate: int) -> list[SpeechSegment]:
        """The speech segments of one leg's whole audio (float samples at ``sample_rate``).

        The leg goes through the worker's front end (resampler, VAD segmenter) in chunks, then is
        finished as a call's end finishes it; the segmenter does not depend on how audio was chunked,
        so this gives the segments a streamed leg of the same audio gets. `callqa transcribe` and
        `callqa analyze` both take this path.
        """
        front_end = LegFrontEnd(sample_rate, "pcm16", self.settings)
        chunk = max(1, int(sample_rate * FILE_CHUNK_S))
        segments: list[SpeechSegment] = []
        for start in range(0, samples.size, chunk):
            segments.extend(front_end.accept_samples(samples[start : start + chunk]))
        return segments + front_end.finish()

    def file_segments(self, path: str | Path) -> list[tuple[int, SpeechSegment]]:
        """(channel, segment) for every speech segment of every channel of an audio file."""
        audio = load_audio(path)
        return [
            (channel, segment)
            for channel, samples in enumerate(audio.samples)
            for segment in self.leg_segments(samples, audio.sample_rate)
        ]

    def transcribe_file(self, path: str | Path) -> list[TranscriptResult]:
        """Transcripts of a file's speech segments, every channel, ordered by start time."""
        pairs = self.file_segments(path)
        results: list[TranscriptResult] = []
        for channel in sorted({c for c, _ in pairs}):
            segments = [s for c, s in pairs if c == channel]
            results.extend(replace(r, channel=channel) for r in self.transcribe_segments(segments))
        return sorted(results, key=lambda r: (r.start_ms, r.channel))
