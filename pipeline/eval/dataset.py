"""The evaluation sets, real recordings shipped by Debian packages: ``eval`` (20 recordings, 117 words,
wide-band read speech and commands) and ``asterisk`` (the Asterisk core prompts: 8 kHz recordings of a
professional telephony voice, with the package's transcripts).

See pipeline/eval/README.md for provenance and licences. Paths are the Debian install locations of
``pocketsphinx-testdata``, ``alsa-utils``, ``asterisk-core-sounds-en-wav`` and ``asterisk-core-sounds-en``;
a missing package raises AudioFileError (or EvalSetMissingError) naming the file.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample

POCKETSPHINX_DATA = Path("/usr/share/pocketsphinx/test/data")
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
SAMPLE_RATE = 16000

ASTERISK_SOUNDS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
ASTERISK_TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
POCKETSPHINX_LICENCE = "BSD-2-Clause (CMU Sphinx test data; LibriVox readings are public domain)"
ALSA_LICENCE = "GPL-2.0 (alsa-utils)"
ASTERISK_LICENCE = "CC-BY-SA-3.0 (Asterisk core sounds, Digium; voice of Allison Smith)"

# The tidigits transcript is spelled in the file name: z is zero, o is oh.
_TIDIGIT_WORDS = {"z": "zero", "o": "oh", **{str(d): w for d, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])}}
# A Sphinx transcription line: "<s> words </s> (utterance id)"
_SPHINX_LINE = re.compile(r"^\s*(?:<s>)?(?P<text>.*?)(?:</s>)?\s*\((?P<id>[^)]+)\)\s*$")
# An Asterisk transcript line: "name: text", the name being the sound's path without ".wav".
_ASTERISK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9_/.-]+):\s*(?P<text>.*?)\s*$")
# Descriptions of sounds that are not speech: "[ascending tones]", "<beep ascending>", "(1 second of silence)".
_ANNOTATION = re.compile(r"\[[^\]]*\]|<[^>]*>|\([^)]*\)")
# The keypad keys as the prompts say them ("press * to toggle pause": "press star ...").
_KEYS = {"*": "star", "#": "pound"}


class EvalSetMissingError(FileNotFoundError):
    """An evaluation set's package is not installed; the message names the package and the path."""


@dataclass(frozen=True)
class EvalUtterance:
    """One recording with its reference transcript; audio is mono float32 at 16 kHz. ``narrow``: under a
    telephony condition, the 8 kHz samples as received (``audio`` is them upsampled), which the worker's
    path takes as a leg's."""

    id: str
    audio: np.ndarray
    reference: str
    source: str
    licence: str
    narrow: np.ndarray | None = field(default=None, repr=False, compare=False)

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
        file_utterance("goforward", POCKETSPHINX_DATA / "goforward.raw", "go forward ten meters", POCKETSPHINX_LICENCE),
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
        file_utterance(f"{prefix}/{utt_id}", folder / f"{utt_id}.wav", text, POCKETSPHINX_LICENCE)
        for utt_id, text in sorted(transcripts.items())
    ]


def _tidigits(path: Path) -> EvalUtterance:
    digits = path.stem.split(".")[-1]
    reference = " ".join(_TIDIGIT_WORDS[c] for c in digits)
    return file_utterance(f"tidigits/{path.stem}", path, reference, POCKETSPHINX_LICENCE)


def _alsa_voices() -> list[EvalUtterance]:
    paths = sorted(p for p in ALSA_SOUNDS.glob("*.wav") if p.name != "Noise.wav")
    return [
        file_utterance(f"alsa/{p.stem}", p, p.stem.replace("_", " ").lower(), ALSA_LICENCE) for p in paths
    ]


def file_utterance(utt_id: str, path: Path, reference: str, licence: str) -> EvalUtterance:
    """A recording file as an utterance: mono, resampled to 16 kHz."""
    audio = load_audio(path)
    samples = resample(audio.mono(), audio.sample_rate, SAMPLE_RATE)
    return EvalUtterance(utt_id, samples, reference, str(path), licence)


def load_asterisk_set() -> list[EvalUtterance]:
    """The Asterisk prompts whose transcript says words (not "[beep tone]"), in name order, at 16 kHz."""
    return [
        file_utterance(f"asterisk/{name}", ASTERISK_SOUNDS / f"{name}.wav", spoken_words(text), ASTERISK_LICENCE)
        for name, text in sorted(asterisk_transcripts().items())
        if is_speech_transcript(text) and (ASTERISK_SOUNDS / f"{name}.wav").exists()
    ]


def asterisk_non_speech() -> list[EvalUtterance]:
    """The Asterisk sounds the transcripts describe as not speech (beeps, tones) and the silences: audio
    that must come out with no words."""
    described = [name for name, text in asterisk_transcripts().items() if not is_speech_transcript(text)]
    silences = [p.relative_to(ASTERISK_SOUNDS).with_suffix("").as_posix()
                for p in sorted((ASTERISK_SOUNDS / "silence").glob("*.wav"))]
    names = sorted(set(described) | set(silences))
    return [file_utterance(f"asterisk/{n}", ASTERISK_SOUNDS / f"{n}.wav", "", ASTERISK_LICENCE)
            for n in names if (ASTERISK_SOUNDS / f"{n}.wav").exists()]


def asterisk_transcripts(path: Path = ASTERISK_TRANSCRIPTS) -> dict[str, str]:
    """Sound name -> transcript, from the package's ``core-sounds-en.txt.gz``."""
    if not path.exists():
        raise EvalSetMissingError(f"{path}: not found (Debian package asterisk-core-sounds-en; make setup)")
    if not ASTERISK_SOUNDS.is_dir():
        raise EvalSetMissingError(f"{ASTERISK_SOUNDS}: not found (Debian package asterisk-core-sounds-en-wav; "
                                  "make setup)")
    return parse_asterisk_transcripts(gzip.decompress(path.read_bytes()).decode("utf-8", "replace"))


def parse_asterisk_transcripts(text: str) -> dict[str, str]:
    """``name: text`` lines (``;`` starts a comment) -> name -> text, whitespace collapsed."""
    transcripts = {}
    for line in text.splitlines():
        match = _ASTERISK_LINE.match(line)
        if match and not line.startswith(";"):
            transcripts[match["name"]] = " ".join(match["text"].split())
    return transcripts


def spoken_words(text: str) -> str:
    """A transcript without its descriptions of sounds ("[beep]", "<tone>"), keypad keys as said."""
    words = _ANNOTATION.sub(" ", text)
    for key, said in _KEYS.items():
        words = words.replace(key, f" {said} ")
    return " ".join(words.split())


def is_speech_transcript(text: str) -> bool:
    """Whether a transcript says words, once descriptions of sounds are taken out."""
    return bool(re.search(r"[A-Za-z0-9]", spoken_words(text)))
