"""The evaluation set: 20 real recordings (117 words) shipped by Debian packages.

See pipeline/eval/README.md for provenance and licences. Paths are the Debian install locations of
``pocketsphinx-testdata`` and ``alsa-utils``; a missing package raises AudioFileError naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample

POCKETSPHINX_DATA = Path("/usr/share/pocketsphinx/test/data")
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
SAMPLE_RATE = 16000

POCKETSPHINX_LICENCE = "BSD-2-Clause (CMU Sphinx test data; LibriVox readings are public domain)"
ALSA_LICENCE = "GPL-2.0 (alsa-utils)"

# The tidigits transcript is spelled in the file name: z is zero, o is oh.
_TIDIGIT_WORDS = {"z": "zero", "o": "oh", **{str(d): w for d, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])}}
# A Sphinx transcription line: "<s> words </s> (utterance id)"
_SPHINX_LINE = re.compile(r"^\s*(?:<s>)?(?P<text>.*?)(?:</s>)?\s*\((?P<id>[^)]+)\)\s*$")


@dataclass(frozen=True)
class EvalUtterance:
    """One recording with its reference transcript; audio is mono float32 at 16 kHz."""

    id: str
    audio: np.ndarray
    reference: str
    source: str
    licence: str

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE

    @property
    def word_count(self) -> int:
        return len(self.reference.split())


def load_eval_set() -> list[EvalUtterance]:
    """All 20 utterances, in a fixed order: librivox, cards, goforward, tidigits, alsa."""
    return [
        *_sphinx_transcribed(POCKETSPHINX_DATA / "librivox", "transcription", "librivox"),
        *_sphinx_transcribed(POCKETSPHINX_DATA / "cards", "cards.transcription", "cards"),
        _utterance("goforward", POCKETSPHINX_DATA / "goforward.raw", "go forward ten meters", POCKETSPHINX_LICENCE),
        _tidigits(POCKETSPHINX_DATA / "tidigits" / "dhd.2934z.raw"),
        *_alsa_voices(),
    ]


def parse_sphinx_transcription(text: str) -> dict[str, str]:
    """Utterance id -> transcript, from a Sphinx ``transcription`` file."""
    transcripts = {}
    for line in text.splitlines():
        match = _SPHINX_LINE.match(line)
        if match:
            transcripts[match["id"]] = " ".join(match["text"].split())
    return transcripts


def _sphinx_transcribed(folder: Path, transcription: str, prefix: str) -> list[EvalUtterance]:
    transcripts = parse_sphinx_transcription((folder / transcription).read_text())
    return [
        _utterance(f"{prefix}/{utt_id}", folder / f"{utt_id}.wav", text, POCKETSPHINX_LICENCE)
        for utt_id, text in sorted(transcripts.items())
    ]


def _tidigits(path: Path) -> EvalUtterance:
    digits = path.stem.split(".")[-1]
    reference = " ".join(_TIDIGIT_WORDS[c] for c in digits)
    return _utterance(f"tidigits/{path.stem}", path, reference, POCKETSPHINX_LICENCE)


def _alsa_voices() -> list[EvalUtterance]:
    paths = sorted(p for p in ALSA_SOUNDS.glob("*.wav") if p.name != "Noise.wav")
    return [
        _utterance(f"alsa/{p.stem}", p, p.stem.replace("_", " ").lower(), ALSA_LICENCE) for p in paths
    ]


def _utterance(utt_id: str, path: Path, reference: str, licence: str) -> EvalUtterance:
    audio = load_audio(path)
    samples = resample(audio.mono(), audio.sample_rate, SAMPLE_RATE)
    return EvalUtterance(utt_id, samples, reference, str(path), licence)
