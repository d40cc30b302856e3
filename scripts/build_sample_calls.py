"""Build the two-leg sample calls in samples/calls/ from real recordings of the evaluation set.

Each call is a stereo 8 kHz 16-bit WAV: left channel the agent, right channel the customer. Every
utterance is a real recording from pocketsphinx-testdata (BSD-2-Clause; LibriVox readings public
domain), trimmed to its speech (+100 ms) by frame energy (pipeline.eval.speech_span) and placed at a fixed time. A faint seeded
noise floor (-70 dBFS) keeps pauses from being digital zero, as on a real line. The output is
deterministic: same packages, same bytes. samples/calls/manifest.json records every placement.

Usage: python scripts/build_sample_calls.py [--out samples/calls]
"""

from __future__ import annotations

import argparse
import json
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.eval.speech_span import speech_span_ms

RATE = 8000
SAMPLES_PER_MS = RATE // 1000
LEGS = ("agent", "customer")  # channel 0 (left), channel 1 (right)
TRIM_MARGIN_MS = 100  # kept on each side of the energy-detected speech, so soft onsets survive
PEAK = 0.9  # louder recordings are scaled down: the cards ones overshoot full scale once resampled
NOISE_RMS = 10 ** (-70 / 20)
MIN_DURATION_MS = 20000
TAIL_MS = 600
SEED = 20240611
LIBRIVOX = "librivox/sense_and_sensibility_01_austen_64kb-0"

# (leg, eval utterance id, start ms). The agent (one LibriVox reader) opens every call; customers are
# the cards, goforward and tidigits speakers. Placements that overlap across legs are deliberate.
CALLS: dict[str, list[tuple[str, str, int]]] = {
    "call_01": [
        ("agent", LIBRIVOX + "880", 300),
        ("customer", "cards/001", 3400),
        ("agent", LIBRIVOX + "930", 5000),
        ("customer", "cards/004", 7100),  # starts before the agent has finished: overlap
        ("agent", LIBRIVOX + "870", 9800),
        ("customer", "goforward", 17300),
    ],
    "call_02": [
        ("agent", LIBRIVOX + "890", 400),
        ("customer", "cards/005", 6200),
        ("agent", LIBRIVOX + "880", 10400),
        ("customer", "tidigits/dhd.2934z", 13800),
        ("agent", LIBRIVOX + "930", 17600),  # after a pause of more than 2 s
    ],
    "call_03": [
        ("agent", LIBRIVOX + "920", 500),
        ("customer", "cards/002", 5200),  # talks over the end of the agent's sentence
        ("customer", "cards/003", 8600),
        ("agent", LIBRIVOX + "930", 10700),
        ("customer", "goforward", 14600),
        ("agent", LIBRIVOX + "880", 17200),
    ],
}


@dataclass(frozen=True)
class TrimmedSpeech:
    utterance: EvalUtterance
    audio_8k: np.ndarray
    source_start_ms: int
    source_end_ms: int
    speech_offset_ms: int  # energy-detected speech within audio_8k
    speech_end_offset_ms: int
    gain: float  # applied to the source recording


def trim_to_speech(utterance: EvalUtterance) -> TrimmedSpeech:
    """The utterance at 8 kHz, cut to its energy-detected speech plus 100 ms on each side."""
    audio = resample(utterance.audio, 16000, RATE)
    gain = min(1.0, PEAK / float(np.abs(audio).max()))
    audio = (audio * gain).astype(np.float32)
    speech_start, speech_end = speech_span_ms(audio, RATE)
    start_ms = max(speech_start - TRIM_MARGIN_MS, 0)
    end_ms = min(speech_end + TRIM_MARGIN_MS, audio.size // SAMPLES_PER_MS)
    return TrimmedSpeech(
        utterance, audio[start_ms * SAMPLES_PER_MS : end_ms * SAMPLES_PER_MS], start_ms, end_ms,
        speech_start - start_ms, speech_end - start_ms, round(gain, 4),
    )


def build_call(name: str, placements: list[tuple[str, str, int]], speech: dict[str, TrimmedSpeech],
               rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """The call's [2, n] samples and its manifest entry."""
    entries = []
    for leg, utt_id, start_ms in placements:
        piece = speech[utt_id]
        end_ms = start_ms + piece.audio_8k.size // SAMPLES_PER_MS
        entries.append({
            "leg": leg, "channel": LEGS.index(leg), "start_ms": start_ms, "end_ms": end_ms,
            "speech_start_ms": start_ms + piece.speech_offset_ms,
            "speech_end_ms": start_ms + piece.speech_end_offset_ms,
            "utterance_id": utt_id, "source": piece.utterance.source,
            "source_start_ms": piece.source_start_ms, "source_end_ms": piece.source_end_ms, "gain": piece.gain,
            "reference": piece.utterance.reference, "licence": piece.utterance.licence,
        })
    _check_no_overlap_within_a_leg(name, entries)
    duration_ms = max(MIN_DURATION_MS, max(e["end_ms"] for e in entries) + TAIL_MS)
    samples = rng.normal(0.0, NOISE_RMS, size=(2, duration_ms * SAMPLES_PER_MS)).astype(np.float32)
    for entry, (_, utt_id, _) in zip(entries, placements, strict=True):
        audio = speech[utt_id].audio_8k
        begin = entry["start_ms"] * SAMPLES_PER_MS
        samples[entry["channel"], begin : begin + audio.size] += audio
    manifest = {"file": f"{name}.wav", "sample_rate": RATE, "channels": 2, "duration_ms": duration_ms,
                "channel_legs": list(LEGS), "utterances": sorted(entries, key=lambda e: e["start_ms"])}
    return samples, manifest


def _check_no_overlap_within_a_leg(name: str, entries: list[dict]) -> None:
    for leg in LEGS:
        spans = sorted((e["start_ms"], e["end_ms"]) for e in entries if e["leg"] == leg)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise ValueError(f"{name}: two {leg} utterances overlap at {start} ms")


def write_wav(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(samples.shape[0])
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(codecs.encode(samples.T.ravel(), "pcm16"))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    wanted = {utt_id for placements in CALLS.values() for _, utt_id, _ in placements}
    speech = {u.id: trim_to_speech(u) for u in load_eval_set() if u.id in wanted}
    rng = np.random.default_rng(SEED)
    calls = []
    for name, placements in CALLS.items():
        samples, manifest = build_call(name, placements, speech, rng)
        write_wav(out / manifest["file"], samples)
        calls.append(manifest)
    (out / "manifest.json").write_text(json.dumps({"calls": calls}, indent=2) + "\n")
    for call in calls:
        print(f"{call['file']}: {call['duration_ms'] / 1000:.1f} s, {len(call['utterances'])} utterances")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("samples/calls"))
    main(parser.parse_args().out)
