"""Audio that is not speech but reaches a call leg — hold music, tones, line noise, silence, breathing —
and what the engine makes of it. Whisper trained on subtitles turns such audio into "Thank you." or
"♪"; a QA transcript must show nothing there. The measure: words emitted, through the worker's path (the
leg's μ-law audio → VAD segmenter → recogniser, dropping what the no-speech rule drops); goal 0.

Sources, all on the machine: Asterisk's hold music (Debian ``asterisk-moh-opsound-wav``, CC-BY-SA-3.0),
its tones and silences (``dataset.asterisk_non_speech``), ALSA's ``Noise.wav`` and noises generated here
with a fixed seed (white, pink and brown noise, mains hum with harmonics, breathing-like bursts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.asr.engine import Engine
from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.eval.dataset import ALSA_SOUNDS, SAMPLE_RATE, EvalUtterance, asterisk_non_speech, file_utterance

HOLD_MUSIC = Path("/usr/share/asterisk/moh")
HOLD_MUSIC_LICENCE = "CC-BY-SA-3.0 (Asterisk opsound music on hold)"
GENERATED = "generated here (numpy, fixed seed)"
TELEPHONY_RATE = 8000


def hold_music(max_s: float = 60.0) -> list[EvalUtterance]:
    """Each hold-music track's first ``max_s`` seconds (0: whole tracks)."""
    tracks = sorted(HOLD_MUSIC.glob("*.wav"))
    if not tracks:
        raise FileNotFoundError(f"{HOLD_MUSIC}: no tracks (Debian package asterisk-moh-opsound-wav; make setup)")
    out = []
    for path in tracks:
        u = file_utterance(f"hold-music/{path.stem}", path, "", HOLD_MUSIC_LICENCE)
        out.append(u if max_s <= 0 else EvalUtterance(u.id, u.audio[: int(max_s * SAMPLE_RATE)], "", u.source,
                                                      u.licence))
    return out


def generated_noises(seconds: float = 20.0, seed: int = 7) -> list[EvalUtterance]:
    """Line noises at levels a telephone line carries them (around -30 dBFS RMS), reproducible."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    white = rng.standard_normal(n)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    pink = np.fft.irfft(spectrum / np.sqrt(np.maximum(freqs, 20.0)), n)
    brown = np.cumsum(white)
    brown -= np.convolve(brown, np.ones(801) / 801, mode="same")  # no drift: keep the rumble, lose the DC walk
    hum = sum(np.sin(2 * np.pi * 50 * k * t) / k for k in (1, 2, 3, 5)) + 0.05 * white
    # Breathing: band-limited noise in 0.8 s swells every 3.5 s, quiet in between.
    envelope = np.clip(np.sin(2 * np.pi * t / 3.5), 0, None) ** 2
    breath = np.convolve(white, np.ones(8) / 8, mode="same") * envelope
    noises = {"white": white, "pink": pink, "brown": brown, "mains-hum": hum, "breathing": breath}
    return [EvalUtterance(f"noise/{name}", _at_level(x, -30.0), "", "numpy", GENERATED)
            for name, x in noises.items()]


def non_speech_set(music_s: float = 60.0) -> list[EvalUtterance]:
    """Every non-speech source: tones and silences, hold music, ALSA's noise, generated noises."""
    alsa = file_utterance("alsa/Noise", ALSA_SOUNDS / "Noise.wav", "", "GPL-2.0 (alsa-utils)")
    return [*asterisk_non_speech(), *hold_music(music_s), alsa, *generated_noises()]


@dataclass(frozen=True)
class Emitted:
    """What the engine wrote for one non-speech recording: its segments' texts (empty: nothing)."""

    id: str
    seconds: float
    segments: int  # segments the VAD sent to the recogniser
    texts: tuple[str, ...]  # the texts it kept (the no-speech rule drops the rest)

    @property
    def words(self) -> int:
        return sum(len(t.split()) for t in self.texts)


def emitted_words(engine: Engine, utterances: list[EvalUtterance], encoding: str = "mulaw") -> list[Emitted]:
    """Each recording as a leg would carry it (8 kHz, ``encoding``), through the engine's VAD segmenter and
    recogniser; what it kept."""
    out = []
    for u in utterances:
        narrow = resample(u.audio, SAMPLE_RATE, TELEPHONY_RATE)
        received = codecs.decode(codecs.encode(narrow, encoding), encoding)
        segments = engine.leg_segments(received, TELEPHONY_RATE)
        kept = engine.transcribe_segments(segments)
        out.append(Emitted(u.id, round(u.duration_s, 1), len(segments),
                           tuple(r.text.strip() for r in kept if r.text.strip())))
    return out


def _at_level(x: np.ndarray, dbfs: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean()
    rms = float(np.sqrt(np.mean(x**2))) or 1.0
    return (x * (10 ** (dbfs / 20) / rms)).astype(np.float32)
