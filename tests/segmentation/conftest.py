"""Real speech for the segmentation tests: the evaluation set and the two-leg sample calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio.files import load_audio
from pipeline.config.segmentation import SegmentationSettings
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.segmentation.measure import telephony_leg
from pipeline.segmentation.vad import SileroVad, load_vad

CALLS_DIR = Path(__file__).resolve().parents[2] / "samples" / "calls"


@pytest.fixture(scope="session")
def eval_set() -> list[EvalUtterance]:
    return load_eval_set()


@pytest.fixture(scope="session")
def vad() -> SileroVad:
    return load_vad()


@pytest.fixture
def settings() -> SegmentationSettings:
    """The code defaults, whatever the environment says."""
    return SegmentationSettings()


@pytest.fixture(scope="session")
def line_noise() -> np.ndarray:
    """Ten seconds of seeded noise at -60 dBFS, the floor of a quiet phone line."""
    return np.random.default_rng(7).normal(0, 1e-3, 160000).astype(np.float32)


@pytest.fixture(scope="session")
def call_manifest() -> dict:
    return json.loads((CALLS_DIR / "manifest.json").read_text())


@pytest.fixture(scope="session")
def call_01_legs(call_manifest) -> list[np.ndarray]:
    """Both legs of call_01 at 16 kHz as the pipeline receives them (mu-law, upsampled)."""
    audio = load_audio(CALLS_DIR / call_manifest["calls"][0]["file"])
    return [telephony_leg(audio.samples[channel]) for channel in range(2)]
