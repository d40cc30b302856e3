"""Build the canary utterance every model must transcribe before it takes traffic (pipeline/asr/canary/).

The canary is one real recording: LibriVox's "Sense and Sensibility", chapter 1, utterance 0870, as
Debian's pocketsphinx-testdata ships it (BSD-2-Clause; the LibriVox reading is public domain). It is
trimmed to its speech (+100 ms each side, by frame energy: pipeline.eval.speech_span), resampled to
8 kHz and G.711 mu-law encoded, the codec of a telephony leg, so the canary takes the path live audio
takes. Output: canary.ulaw (headerless 8 kHz mu-law, ~55 KB). Deterministic: same package, same bytes.
Chosen because Whisper tiny.en transcribes it without an error under fp32 and int8, at 16 kHz and
8 kHz mu-law, and its 21 words make the WER bound discriminating (one error = 4.8 points).

Usage: python scripts/build_canary.py [--out pipeline/asr/canary/canary.ulaw]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.asr.canary import CANARY_AUDIO, CANARY_RATE, CANARY_TRANSCRIPT
from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.eval.dataset import SAMPLE_RATE, load_eval_set
from pipeline.eval.speech_span import speech_span_ms

UTTERANCE = "librivox/sense_and_sensibility_01_austen_64kb-0870"
TRIM_MARGIN_MS = 100


def build(out: Path) -> None:
    utterance = next(u for u in load_eval_set() if u.id == UTTERANCE)
    if utterance.reference != CANARY_TRANSCRIPT:
        raise SystemExit(f"{utterance.source}: transcript changed ({utterance.reference!r})")
    start_ms, end_ms = speech_span_ms(utterance.audio, SAMPLE_RATE)
    per_ms = SAMPLE_RATE // 1000
    first = max(0, (start_ms - TRIM_MARGIN_MS) * per_ms)
    last = min(utterance.audio.size, (end_ms + TRIM_MARGIN_MS) * per_ms)
    narrow = resample(utterance.audio[first:last], SAMPLE_RATE, CANARY_RATE)
    out.write_bytes(codecs.encode(narrow, "mulaw"))
    print(f"{out}: {out.stat().st_size} bytes, {narrow.size / CANARY_RATE:.2f} s from {utterance.source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CANARY_AUDIO)
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
