"""Measure segmentation settings on real speech: ``python -m pipeline.segmentation.measure``.

Two data sets: (1) each evaluation utterance alone between 1 s of line noise on both sides, where one
segment per utterance is right; (2) the two-leg sample calls (samples/calls/manifest.json), each leg
fed as the pipeline will (8 kHz, G.711 mu-law, back to 16 kHz in 20 ms frames). Prints a table per
setting variant: utterances covered, splits, merges, false segments, endpoint delay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import StreamResampler
from pipeline.config.segmentation import SegmentationSettings
from pipeline.eval.dataset import load_eval_set
from pipeline.eval.speech_span import speech_span_ms
from pipeline.segmentation.segmenter import Segmenter, SpeechSegment
from pipeline.segmentation.vad import WINDOW, VadStream

CALLS_DIR = Path(__file__).resolve().parents[2] / "samples" / "calls"
FRAME_16K = 320  # 20 ms
NOISE_RMS = 10 ** (-60 / 20)


@dataclass
class Tally:
    utterances: int = 0
    covered: int = 0  # >= 95 % of the utterance's speech span inside segments
    split: int = 0  # covered by more than one segment
    merged: int = 0  # segments that span more than one utterance
    false_segments: int = 0  # segments touching no utterance
    segments: int = 0
    lead_ms: list[int] = field(default_factory=list)  # speech start minus segment start
    tail_ms: list[int] = field(default_factory=list)  # segment end minus speech end

    def row(self) -> str:
        lead, tail = np.array(self.lead_ms or [0]), np.array(self.tail_ms or [0])
        return (f"{self.covered}/{self.utterances} covered, {self.split} split, {self.merged} merged, "
                f"{self.false_segments} false, {self.segments} segments; audio before speech "
                f"min {lead.min():.0f} / median {np.median(lead):.0f} ms, after speech "
                f"min {tail.min():.0f} / median {np.median(tail):.0f} ms")


def segment_stream(audio_16k: np.ndarray, settings: SegmentationSettings) -> list[SpeechSegment]:
    segmenter = Segmenter(settings)
    segments = []
    for i in range(0, audio_16k.size, FRAME_16K):
        segments += segmenter.accept(audio_16k[i : i + FRAME_16K])
    return segments + segmenter.flush()


def score(spans_ms: list[tuple[int, int]], segments: list[SpeechSegment], tally: Tally) -> None:
    tally.utterances += len(spans_ms)
    tally.segments += len(segments)
    for start, end in spans_ms:
        touching = [s for s in segments if s.start_ms < end and s.end_ms > start]
        inside = sum(min(end, s.end_ms) - max(start, s.start_ms) for s in touching)
        tally.covered += inside >= 0.95 * (end - start)
        tally.split += len(touching) > 1
        if touching:
            tally.lead_ms.append(start - min(s.start_ms for s in touching))
            tally.tail_ms.append(max(s.end_ms for s in touching) - end)
    for s in segments:
        hits = sum(s.start_ms < end and s.end_ms > start for start, end in spans_ms)
        tally.false_segments += hits == 0
        tally.merged += hits > 1


def eval_set_in_noise(settings: SegmentationSettings) -> Tally:
    rng = np.random.default_rng(0)
    tally = Tally()
    for utterance in load_eval_set():
        pad = rng.normal(0, NOISE_RMS, 16000).astype(np.float32)
        audio = np.concatenate([pad, utterance.audio, pad])
        start, end = speech_span_ms(utterance.audio, 16000)
        score([(1000 + start, 1000 + end)], segment_stream(audio, settings), tally)
    return tally


def telephony_leg(samples_8k: np.ndarray) -> np.ndarray:
    """A leg as the pipeline receives it: mu-law at 8 kHz, upsampled to 16 kHz in 20 ms frames."""
    received = codecs.decode(codecs.encode(samples_8k, "mulaw"), "mulaw")
    stream = StreamResampler(8000, 16000)
    pieces = [stream.process(received[i : i + 160]) for i in range(0, received.size, 160)]
    return np.concatenate([*pieces, stream.flush()])


def sample_calls(settings: SegmentationSettings) -> Tally:
    manifest = json.loads((CALLS_DIR / "manifest.json").read_text())
    tally = Tally()
    for call in manifest["calls"]:
        audio = load_audio(CALLS_DIR / call["file"])
        for channel in range(audio.channels):
            spans = [(u["speech_start_ms"], u["speech_end_ms"])
                     for u in call["utterances"] if u["channel"] == channel]
            score(spans, segment_stream(telephony_leg(audio.samples[channel]), settings), tally)
    return tally


VARIANTS: dict[str, dict[str, float]] = {
    "defaults": {},
    "endpoint 300 ms": {"endpoint_silence_ms": 300},
    "endpoint 800 ms": {"endpoint_silence_ms": 800},
    "threshold 0.3/0.15": {"vad_threshold": 0.3, "vad_neg_threshold": 0.15},
    "threshold 0.7/0.55": {"vad_threshold": 0.7, "vad_neg_threshold": 0.55},
    "no hysteresis 0.5/0.5": {"vad_neg_threshold": 0.5},
    "max segment 4 s": {"max_segment_ms": 4000},
}


def longest_pauses_ms(settings: SegmentationSettings) -> list[int]:
    """Per evaluation utterance: the longest run of VAD windows below the negative threshold inside
    its speech span. An endpoint shorter than these splits sentences at commas."""
    longest = []
    for utterance in load_eval_set():
        probs = Segmenter(settings).vad.run([VadStream()], [utterance.audio])[0]
        start, end = speech_span_ms(utterance.audio, 16000)
        inside = probs[start * 16 // WINDOW : end * 16 // WINDOW] < settings.vad_neg_threshold
        run = best = 0
        for quiet in inside:
            run = run + 1 if quiet else 0
            best = max(best, run)
        longest.append(best * WINDOW // 16)
    return longest


def main() -> None:
    pauses = sorted(longest_pauses_ms(SegmentationSettings()), reverse=True)
    print(f"longest pause inside each eval utterance (ms, top 6): {pauses[:6]}")
    for name, overrides in VARIANTS.items():
        settings = SegmentationSettings(**overrides)  # type: ignore[arg-type]
        print(f"{name:24s} eval set: {eval_set_in_noise(settings).row()}")
        print(f"{'':24s} calls:    {sample_calls(settings).row()}")


if __name__ == "__main__":
    main()
