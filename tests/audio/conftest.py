"""Real recordings from Debian packages used by the audio tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample

POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")


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
