"""Real recordings from Debian packages used by the audio tests."""

from __future__ import annotations

from pathlib import Path

import pytest

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
