"""Per-leg speech segmentation from Silero VAD probabilities.

A segment opens at the first 32 ms window whose speech probability reaches ``vad_threshold`` (keeping
``pre_roll_ms`` of audio before it) and closes once the probability has stayed below
``vad_neg_threshold`` for ``endpoint_silence_ms`` (keeping ``post_roll_ms`` after the last speech), or
for the shorter ``long_segment_endpoint_ms`` once the segment is ``long_segment_ms`` long.
The two thresholds give hysteresis: a dip between them neither ends speech nor starts it. A segment
that reaches ``max_segment_ms`` is cut at its quietest window in its second half, and the rest of the
speech continues as the next segment. Segments with less than ``min_speech_ms`` of speech are dropped.

All decisions happen per VAD window on absolute sample positions, so the segments do not depend on
how the audio was chunked when it arrived.

Digital silence longer than ``gap_boundary_ms`` (a hold: its gap in the frames is filled with zeros) is a
boundary: the VAD is reset and its windows are no longer scored (vad.py), and ``skip_zeros`` takes such
a run by its length, without the samples, exactly as ``accept`` takes the zeros themselves. Segment
times after it stay in the leg's time.

A segmenter takes 16 kHz samples, or (``input_rate`` 8000) a telephone leg's own 8 kHz samples. At 8 kHz
the VAD scores those (256-sample windows, the same 32 ms grid, so every decision falls on the same 16 kHz
sample positions), and only what can become a segment, the pre-roll and the open segment, is upsampled to
16 kHz: by the same exact streaming filter (pipeline/audio/resample.py) started from the 8 kHz samples the
segment reaches, so its samples are bit for bit those of the leg's whole stream upsampled. The VAD sees
each 8 kHz sample only once the filter's look-ahead has arrived after it, as it sees a 16 kHz sample only
once the filter has made it: decisions come at the same moment of the leg's input at either rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import ceil

import numpy as np

from pipeline.audio.resample import ResamplerSnapshot, StreamResampler
from pipeline.config.segmentation import SegmentationSettings
from pipeline.segmentation.audio_buffer import LegAudioBuffer
from pipeline.segmentation.vad import GEOMETRY, SAMPLE_RATE, WINDOW, SileroVad, VadStream, load_vad, window_of

SAMPLES_PER_MS = SAMPLE_RATE // 1000


@dataclass(frozen=True)
class SpeechSegment:
    """A closed stretch of speech of one leg; times are relative to the start of the leg's audio."""

    index: int  # 0, 1, 2, ... in the order the leg's segments closed
    start_sample: int
    end_sample: int
    audio: np.ndarray = field(repr=False)  # float32, 16 kHz, lead_samples + end_sample - start_sample samples
    speech_ms: int  # time of the windows scored as speech
    reason: str  # "endpoint" (silence), "max_length" (cut) or "flush" (end of the leg's audio)
    lead_samples: int = 0  # audio before start_sample the recogniser hears too (``asr_lead_ms``)

    @property
    def start_ms(self) -> int:
        return self.start_sample // SAMPLES_PER_MS

    @property
    def end_ms(self) -> int:
        return self.end_sample // SAMPLES_PER_MS

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True, slots=True)
class Silence:
    """``samples`` samples of digital silence at the segmenter's input rate (16 kHz, or 8 kHz when its VAD
    scores a telephone leg's own samples), given by their count (``Segmenter.skip_zeros``)."""

    samples: int


@dataclass(frozen=True)
class SegmenterSnapshot:
    """Everything a segmenter between segments needs to go on exactly where it was (a call checkpoint).

    Taken only while no segment is open, so no speech audio is in it: the VAD's recurrent state, the
    samples of an incomplete window, and the pre-roll a next onset may reach back into (inside a run of
    digital silence not yet ``gap_boundary_ms`` long, the whole run: ``restore`` counts it from there).
    """

    vad_state: np.ndarray = field(repr=False)  # [2, 1, 128] float32
    vad_context: np.ndarray = field(repr=False)  # [64] float32; [32] when the VAD ran at 8 kHz
    vad_pending: np.ndarray = field(repr=False)  # < one window, float32
    windows_done: int
    last_end: int  # 16 kHz sample index, like every segment position
    emitted: int
    audio_start: int  # absolute index of audio[0], at the input rate
    audio: np.ndarray = field(repr=False)  # float32 at the input rate, what the buffer held (the pre-roll reach)

    @property
    def input_rate(self) -> int:
        """The rate of the samples the segmenter took (16000, or 8000 with the VAD on them): the VAD's
        context says it, so a snapshot of either kind (and one from before 8 kHz VAD) restores as taken."""
        size = np.asarray(self.vad_context).size
        for rate, (_, context) in GEOMETRY.items():
            if size == context:
                return rate
        raise ValueError(f"a segmenter snapshot with {size} VAD context samples is none of 8 or 16 kHz")


@dataclass
class _OpenSegment:
    start: int  # first sample, including pre-roll
    audio_from: int  # first sample of its audio: ``start`` less the recogniser's lead (asr_lead_ms)
    probs: list[float] = field(default_factory=list)  # of the windows from first_window on
    first_window: int = 0  # absolute index of the window of probs[0]
    speech_windows: int = 0
    silence_since: int | None = None  # sample where the current run of silence began


class Segmenter:
    """Turns one leg's audio into closed speech segments as it streams in: 16 kHz samples, or with
    ``input_rate`` 8000 the leg's own 8 kHz samples, scored at 8 kHz (segments still come at 16 kHz)."""

    def __init__(self, settings: SegmentationSettings | None = None, vad: SileroVad | None = None,
                 input_rate: int = SAMPLE_RATE) -> None:
        self.settings = settings or SegmentationSettings()
        self.vad = vad or load_vad(self.settings.vad_model_path)
        self.input_rate = input_rate
        self._window_in = window_of(input_rate)  # input samples per VAD window
        self._ratio = SAMPLE_RATE // input_rate  # 16 kHz samples per input sample
        # Windows of digital silence in a row after which the VAD is dormant (None: never).
        boundary_ms = self.settings.gap_boundary_ms
        self._dormant_after = ceil(boundary_ms * SAMPLES_PER_MS / WINDOW) if boundary_ms > 0 else None
        self.vad_stream = VadStream(self._dormant_after, input_rate)
        # The leg's recent input (at 16 kHz: what segments are cut from).
        self._audio = LegAudioBuffer()
        # 8 kHz input: the upsampler's look-ahead (input samples the VAD waits for after each one), and
        # while a segment is open, its 16 kHz audio and the upsampler making it.
        self._lookahead = 0 if self._ratio == 1 else StreamResampler(input_rate, SAMPLE_RATE).lookahead
        self._upsampler: StreamResampler | None = None
        self._wide = LegAudioBuffer()
        self._end_pad: int | None = None  # 8 kHz input, once flushed: the 16 kHz zeros after the leg's end
        self._windows_done = 0
        self._open: _OpenSegment | None = None
        self._last_end = 0  # end of the last emitted segment: pre-roll never reaches back past it
        self._emitted = 0
        self._ms = {
            "pre_roll": self.settings.pre_roll_ms * SAMPLES_PER_MS,
            "lead": self.settings.asr_lead_ms * SAMPLES_PER_MS,
            "post_roll": self.settings.post_roll_ms * SAMPLES_PER_MS,
            "endpoint": self.settings.endpoint_silence_ms * SAMPLES_PER_MS,
            "max": self.settings.max_segment_ms * SAMPLES_PER_MS,
            "long": self.settings.long_segment_ms * SAMPLES_PER_MS,
            "long_endpoint": self.settings.long_segment_endpoint_ms * SAMPLES_PER_MS,
        }

    @property
    def in_speech(self) -> bool:
        """Whether a segment is open (speech started and its endpoint not reached)."""
        return self._open is not None

    @property
    def samples_received(self) -> int:
        """The leg's audio the VAD has been given, in 16 kHz samples."""
        return self._audio.end if self._ratio == 1 else self._vad_fed * self._ratio

    @property
    def _vad_fed(self) -> int:
        """Input samples given to the VAD so far (between steps)."""
        return self._windows_done * self._window_in + self.vad_stream.pending_samples

    @property
    def open_segment_start_ms(self) -> int | None:
        """Start of the open segment (pre-roll included), as its SpeechSegment will have it."""
        return None if self._open is None else self._open.start // SAMPLES_PER_MS

    @property
    def open_segment_ms(self) -> int | None:
        """How long the open segment is so far, from its start (the lead not counted), without copying its audio;
        None when none is open."""
        if self._open is None:
            return None
        return ((self._audio.end if self._ratio == 1 else self._wide.end) - self._open.start) // SAMPLES_PER_MS

    @property
    def open_segment_lead(self) -> int:
        """Samples of the open segment's audio before its start (``asr_lead_ms``): 0 when none is open."""
        return 0 if self._open is None else self._open.start - self._open.audio_from

    def provisional_end(self) -> tuple[int, int] | None:
        """(start_sample, end_sample) the open segment will have if it closes at its endpoint, once that
        is known: its trailing silence has passed the post-roll, so no sample of it is still to come.
        None while speech goes on, or when it is too short to be kept. If speech resumes before the
        endpoint the segment grows instead (or is cut at ``max_segment_ms``): callers compare keys."""
        segment = self._open
        if segment is None or segment.silence_since is None:
            return None
        end = segment.silence_since + self._ms["post_roll"]
        if self._windows_done * WINDOW < end:
            return None
        if segment.speech_windows * WINDOW // SAMPLES_PER_MS < self.settings.min_speech_ms:
            return None
        return segment.start, end

    def provisional_audio(self, start: int, end: int) -> np.ndarray:
        """The audio the open segment ``(start, end)`` (``provisional_end``'s key) will have, its lead
        included, as its SpeechSegment will: a copy."""
        segment = self._open
        lead_from = segment.audio_from if segment is not None and segment.start == start else start
        return self._segment_audio(lead_from, end)

    def open_segment_audio(self) -> np.ndarray | None:
        """The audio of the open segment so far, its lead included (for partial transcripts), or None."""
        if self._open is None:
            return None
        return self._segment_audio(self._open.audio_from, self._audio.end if self._ratio == 1 else self._wide.end)

    def _segment_audio(self, start: int, end: int) -> np.ndarray:
        """16 kHz samples ``[start, end)`` of the open segment (or one just closed), a copy."""
        return (self._audio if self._ratio == 1 else self._wide).slice(start, end)

    def snapshot(self) -> SegmenterSnapshot:
        """The state to resume from (see ``restore``); only between segments."""
        if self._open is not None:
            raise RuntimeError("a segmenter is snapshotted only between segments")
        vad = self.vad_stream
        return SegmenterSnapshot(
            vad.state.copy(), vad.context.copy(), vad.pending.copy(), self._windows_done, self._last_end,
            self._emitted, self._audio.start, self._audio.slice(self._audio.start, self._audio.end),
        )

    def restore(self, snap: SegmenterSnapshot) -> None:
        """Go on from ``snap`` as if every sample before it had been fed to this segmenter (one of the same
        ``input_rate``: ``snap.input_rate`` says which)."""
        if snap.input_rate != self.input_rate:
            raise ValueError(f"a snapshot of a segmenter at {snap.input_rate} Hz restores into one at that "
                             f"rate, not {self.input_rate} Hz")
        self.vad_stream = VadStream.restored(snap.vad_state, snap.vad_context, snap.vad_pending,
                                             self._dormant_after, self._zero_windows_of(snap), self.input_rate)
        self._upsampler, self._wide, self._end_pad = None, LegAudioBuffer(), None
        self._audio = LegAudioBuffer(max(16000, snap.audio.size))
        self._audio.start = snap.audio_start
        self._audio.append(snap.audio)
        self._windows_done, self._last_end, self._emitted = snap.windows_done, snap.last_end, snap.emitted
        self._open = None

    def _zero_windows_of(self, snap: SegmenterSnapshot) -> int:
        """The run of zero windows ``snap`` was taken in. Dormant: the VAD state was reset (no scored
        window leaves it all zeros). Otherwise the run is in the audio (``advance`` keeps it whole)."""
        if self._dormant_after is None:
            return 0
        if snap.windows_done > 0 and not np.asarray(snap.vad_state).any():
            return self._dormant_after + 1
        window = self._window_in
        first = -(-snap.audio_start // window)  # the first window held whole
        lo, hi = first * window - snap.audio_start, snap.windows_done * window - snap.audio_start
        if hi <= lo:
            return 0
        sound = np.asarray(snap.audio[lo:hi]).reshape(-1, window).any(axis=1)
        return int(sound.size - 1 - np.flatnonzero(sound)[-1]) if sound.any() else int(sound.size)

    def accept(self, samples: np.ndarray) -> list[SpeechSegment]:
        """Take the next samples of the leg (at ``input_rate``); the segments that closed."""
        return self.advance(self.vad.run([self.vad_stream], [self.feed(samples)])[0])

    def take(self, audio: np.ndarray | Silence) -> list[SpeechSegment]:
        """``accept`` samples, or ``skip_zeros`` a run of silence given by its length."""
        return self.skip_zeros(audio.samples) if isinstance(audio, Silence) else self.accept(audio)

    def skip_zeros(self, count: int) -> list[SpeechSegment]:
        """``accept(np.zeros(count))``, the same segments and state, without making the zeros: they are
        scored only until the VAD is dormant (``gap_boundary_ms``), the rest moves the clock on."""
        closed: list[SpeechSegment] = []
        window = self._window_in
        while count > 0 and not self._skips_zeros():
            # Scored: the rest of the pending window and a boundary's worth of windows at a time (without
            # a boundary, a minute: only the memory is bounded then).
            lead = 60 * self.input_rate if self._dormant_after is None else (
                (-self.vad_stream.pending_samples) % window + window * (self._dormant_after + 1))
            if self._upsampler is not None:  # a segment open: its zeros are upsampled, only until it closes
                lead = min(lead, 4 * window)
            step = min(count, lead)
            closed.extend(self.accept(np.zeros(step, dtype=np.float32)))
            count -= step
        if count > 0:
            # Idle, so the VAD takes these zeros as they come (at 8 kHz its look-ahead's are zeros too).
            self._windows_done += self.vad_stream.skip_zeros(count)
            self._audio.append_zeros(count, self._keep_input_from())
        return closed

    def _skips_zeros(self) -> bool:
        """Whether more zeros would only be dormant windows of an idle segmenter."""
        stream = self.vad_stream
        if self._open is not None or not stream.dormant or stream.pending.any():
            return False
        return self._ratio == 1 or not self._audio.slice(self._vad_fed, self._audio.end).any()

    def flush(self) -> list[SpeechSegment]:
        """End of the leg: score the incomplete last window and close any open segment."""
        end = self._audio.end * self._ratio
        if self._ratio == 1:
            closed = self.accept(self.vad_stream.pad_pending())
        else:
            # The look-ahead the VAD waited for is the leg's end now: the rest of the input, then zeros to
            # the window's end; the open segment's audio upsampled to the end as if silence followed (the
            # resampler's flush), then those zeros, as the 16 kHz path appends them.
            tail = self._audio.slice(self._vad_fed, self._audio.end)
            pad = (-(self.vad_stream.pending_samples + tail.size)) % self._window_in
            self._end_pad = pad * self._ratio
            if self._upsampler is not None:
                self._extend_wide()
            tail = np.concatenate([tail, np.zeros(pad, dtype=np.float32)])
            closed = self.advance(self.vad.run([self.vad_stream], [tail])[0])
        if self._open is not None:
            closed.extend(self._close(self._speech_end(end), "flush"))
        return closed

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """Take the leg's next samples (at ``input_rate``); what the VAD is to score next (``advance``
        applies its probabilities). At 8 kHz: all but the look-ahead the upsampler still waits for."""
        samples = np.asarray(samples, dtype=np.float32)
        if self._ratio == 1:
            self._audio.append(samples)
            return samples
        fed = self._vad_fed
        self._audio.append(samples)
        if self._upsampler is not None:
            self._extend_wide()
        return self._audio.slice(fed, max(fed, self._audio.end - self._lookahead))

    def advance(self, probs: np.ndarray) -> list[SpeechSegment]:
        """Apply the VAD ``probs`` of the windows the samples ``feed`` took completed.

        ``accept`` does both; ``accept_many`` calls them around one batched VAD run over many legs.
        """
        closed: list[SpeechSegment] = []
        for prob in probs:
            closed.extend(self._step(float(prob)))
            self._windows_done += 1
        if self._open is None:
            self._audio.drop_before(self._keep_input_from())
            if self._upsampler is not None:
                self._upsampler, self._wide = None, LegAudioBuffer()
        return closed

    def _keep_from(self) -> int:
        """Idle: the audio to keep (a 16 kHz position), just enough for the pre-roll of the next onset, and
        a run of digital silence not yet dormant, whole (a snapshot taken in it must say how long it is)."""
        keep = max(self._windows_done * WINDOW - self._ms["pre_roll"] - self._ms["lead"], self._last_end)
        run = self.vad_stream.zero_windows
        if self._dormant_after is not None and 0 < run <= self._dormant_after:
            keep = min(keep, (self._windows_done - run) * WINDOW)
        return keep

    def _keep_input_from(self) -> int:
        """``_keep_from`` in input samples: at 8 kHz with the input the upsampler reaches back to."""
        keep = self._keep_from()
        return keep if self._ratio == 1 else max(0, keep // self._ratio - self._lookahead)

    def _held_from(self) -> int:
        """The first 16 kHz sample the input held can give (a pre-roll reaches no further back)."""
        start = self._audio.start
        if self._ratio == 1 or start == 0:
            return start * self._ratio
        return (start + self._lookahead - 1) * self._ratio

    def _start_wide(self, start: int) -> None:
        """8 kHz input: the open segment's 16 kHz audio from ``start`` on, from the input held: a resampler
        restored where the leg's whole stream would stand, so the samples are that stream's."""
        assert start % self._ratio == 0, "segment positions fall on input samples"
        first_tap = start // self._ratio - self._lookahead + 1  # the first input sample output `start` reaches
        held = max(first_tap, 0)
        assert self._audio.start <= held, "the pre-roll's input was dropped"
        self._upsampler = StreamResampler.restored(self.input_rate, SAMPLE_RATE, ResamplerSnapshot(
            held, start, np.zeros(0, dtype=np.float32)))  # before the leg's start: silence
        self._wide = LegAudioBuffer()
        self._wide.start = start
        self._extend_wide()

    def _extend_wide(self) -> None:
        """The open segment's 16 kHz audio, up to what the input held gives (to the leg's end once flushed)."""
        upsampler = self._upsampler
        assert upsampler is not None
        self._wide.append(upsampler.process(self._audio.slice(upsampler.samples_in, self._audio.end)))
        if self._end_pad is not None:
            self._wide.append(upsampler.flush())
            self._wide.append(np.zeros(self._end_pad, dtype=np.float32))

    def _step(self, prob: float) -> list[SpeechSegment]:
        start = self._windows_done * WINDOW
        end = start + WINDOW
        s = self.settings
        if self._open is None:
            if prob >= s.vad_threshold:
                floor = max(self._last_end, self._held_from())
                pre_roll_start = max(start - self._ms["pre_roll"], floor)
                # The lead is heard, not timed: talk and overlap metrics keep the pre-roll's start.
                audio_from = max(pre_roll_start - self._ms["lead"], floor)
                self._open = _OpenSegment(pre_roll_start, audio_from, first_window=self._windows_done)
                if self._ratio > 1:
                    self._start_wide(audio_from)
            else:
                return []
        segment = self._open
        segment.probs.append(prob)
        if prob >= s.vad_threshold:
            segment.speech_windows += 1
            segment.silence_since = None
        elif prob < s.vad_neg_threshold and segment.silence_since is None:
            segment.silence_since = start
        if segment.silence_since is not None and end - segment.silence_since >= self._endpoint_of(segment):
            return self._close(self._speech_end(end), "endpoint")
        if end - segment.start >= self._ms["max"]:
            return self._cut(end)
        return []

    def _endpoint_of(self, segment: _OpenSegment) -> int:
        """The trailing silence (samples) that closes ``segment``: shorter once its speech before the pause
        is ``long_segment_ms`` long, so a long turn ends at its next pause and is decoded in stretches."""
        assert segment.silence_since is not None
        long = self._ms["long"]
        if long and segment.silence_since - segment.start >= long:
            return self._ms["long_endpoint"]
        return self._ms["endpoint"]

    def _speech_end(self, now: int) -> int:
        assert self._open is not None
        silence = self._open.silence_since
        return now if silence is None else min(silence + self._ms["post_roll"], now)

    def _close(self, end: int, reason: str) -> list[SpeechSegment]:
        segment = self._open
        assert segment is not None
        self._open = None
        speech_ms = segment.speech_windows * WINDOW // SAMPLES_PER_MS
        if speech_ms < self.settings.min_speech_ms:
            return []
        self._last_end = end
        emitted = SpeechSegment(self._emitted, segment.start, end, self._segment_audio(segment.audio_from, end),
                                speech_ms, reason, segment.start - segment.audio_from)
        self._emitted += 1
        return [emitted]

    def _cut(self, now: int) -> list[SpeechSegment]:
        """Close the too-long open segment at its quietest window in the second half; continue after it."""
        segment = self._open
        assert segment is not None
        half = (segment.start + now) // 2
        first_candidate = max(0, (half // WINDOW) - segment.first_window)
        candidates = segment.probs[first_candidate:]
        quietest = first_candidate + int(np.argmin(candidates))
        cut = (segment.first_window + quietest) * WINDOW + WINDOW // 2
        speech_after = sum(p >= self.settings.vad_threshold for p in segment.probs[quietest + 1 :])
        segment.speech_windows -= speech_after
        silence = segment.silence_since
        closed = self._close(cut, "max_length")
        rest = _OpenSegment(cut, cut, segment.probs[quietest + 1 :], segment.first_window + quietest + 1)
        rest.speech_windows = speech_after
        rest.silence_since = None if silence is None else max(silence, cut)
        self._open = rest
        return closed


def accept_many(segmenters: Sequence[Segmenter], chunks: Sequence[np.ndarray]) -> list[list[SpeechSegment]]:
    """``Segmenter.accept`` for many legs at once, with one batched VAD run (legs at 8 and 16 kHz in a
    batch each); they must share one SileroVad."""
    if not segmenters:
        return []
    vad = segmenters[0].vad
    if any(s.vad is not vad for s in segmenters):
        raise ValueError("accept_many needs segmenters that share one SileroVad")
    inputs = [s.feed(c) for s, c in zip(segmenters, chunks, strict=True)]
    probs = vad.run([s.vad_stream for s in segmenters], inputs)
    return [s.advance(p) for s, p in zip(segmenters, probs, strict=True)]
