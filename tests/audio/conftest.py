"""Real recordings from Debian packages used by the audio tests, and keypad tones made by hand (sine pairs at
the ITU-T Q.23 frequencies) for the keypad-tone tests here and in the worker's and the recordings' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample

POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")

RATE = 8000
ROWS = (697.0, 770.0, 852.0, 941.0)
COLUMNS = (1209.0, 1336.0, 1477.0, 1633.0)
KEYS = "123A456B789C*0#D"  # row by row, as Q.23 lays the keypad out
LEAD_MS = 200  # silence before the first tone and after the last
LEVEL_DB = -10.0  # each sine's peak, dBFS: a keypad's -6 to -9 dBm0 after a little line loss


def _ms(n: float) -> int:
    return int(round(n * RATE / 1000))


def key_tone(key: str, ms: float, *, level_db: float = LEVEL_DB, twist_db: float = 0.0, off: float = 0.0,
             rate: int = RATE, seed: int = 0) -> np.ndarray:
    """Key ``key`` for ``ms``: its row and column sines (the column ``twist_db`` above the row), both
    ``off`` (a fraction) from their frequencies, each from its own random phase."""
    index = KEYS.index(key)
    row, column = ROWS[index // 4] * (1 + off), COLUMNS[index % 4] * (1 + off)
    t = np.arange(int(round(ms * rate / 1000))) / rate
    phase = np.random.default_rng(seed).uniform(0, 2 * np.pi, 2)
    amplitude = 10 ** (level_db / 20)
    return (amplitude * np.sin(2 * np.pi * row * t + phase[0])
            + amplitude * 10 ** (twist_db / 20) * np.sin(2 * np.pi * column * t + phase[1])).astype(np.float32)


def dialled(keys: str, on_ms: float, off_ms: float, **tone: object) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``keys`` typed one after another, each ``on_ms`` long with ``off_ms`` of silence after it, between
    LEAD_MS of silence; and where each tone was put, [start_ms, end_ms)."""
    parts, spans = [np.zeros(_ms(LEAD_MS), np.float32)], []
    for k, key in enumerate(keys):
        start = LEAD_MS + k * (on_ms + off_ms)
        spans.append((int(start), int(start + on_ms)))
        parts += [key_tone(key, on_ms, seed=k, **tone), np.zeros(_ms(off_ms), np.float32)]  # type: ignore[arg-type]
    parts.append(np.zeros(_ms(LEAD_MS), np.float32))
    return np.concatenate(parts), spans


@pytest.fixture(scope="session")
def goforward_raw() -> Path:
    """16 kHz s16le headerless recording of "go forward ten meters"."""
    return POCKETSPHINX / "goforward.raw"


@pytest.fixture(scope="session")
def cards_wav() -> Path:
    """16 kHz mono 16-bit WAV."""
    return POCKETSPHINX / "cards" / "001.wav"


@pytest.fixture(scope="session")
def alsa_wav() -> Path:
    """48 kHz mono 16-bit WAV."""
    return ALSA_SOUNDS / "Front_Center.wav"


@pytest.fixture(scope="session")
def speech_recordings_16k() -> dict[str, np.ndarray]:
    """Every real speech recording of the Debian test data, mono at 16 kHz."""
    paths = sorted((POCKETSPHINX / "librivox").glob("*.wav")) + sorted((POCKETSPHINX / "cards").glob("*.wav"))
    paths += [POCKETSPHINX / "goforward.raw", POCKETSPHINX / "tidigits" / "dhd.2934z.raw"]
    paths += sorted(p for p in ALSA_SOUNDS.glob("*.wav") if p.name != "Noise.wav")
    recordings = {}
    for path in paths:
        audio = load_audio(path)
        recordings[path.name] = resample(audio.mono(), audio.sample_rate, 16000)
    return recordings
