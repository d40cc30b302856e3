"""Telephony conditions applied to real speech."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline.audio.resample import resample
from pipeline.eval.conditions import CONDITIONS, apply_condition, conditioned

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop


def _band_energy(audio: np.ndarray, low: float, high: float) -> float:
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(audio.size, 1 / 16000)
    return float(spectrum[(freqs >= low) & (freqs < high)].sum())


@pytest.fixture(scope="module")
def speech(eval_set) -> np.ndarray:
    return next(u.audio for u in eval_set if u.id == "goforward")


def test_wideband_is_unchanged(speech) -> None:
    np.testing.assert_array_equal(apply_condition(speech, "16k"), speech)


@pytest.mark.parametrize("condition", ["8k", "8k-mulaw"])
def test_narrowband_keeps_length_and_loses_everything_above_4_khz(speech, condition) -> None:
    received = apply_condition(speech, condition)
    assert received.dtype == np.float32 and received.size == speech.size
    assert _band_energy(speech, 4100, 8000) > 1e-3 * _band_energy(speech, 0, 4000)
    assert _band_energy(received, 4100, 8000) < 1e-4 * _band_energy(received, 0, 4000)
    # Below 3.4 kHz the speech itself survives (the two filters differ only near 4 kHz).
    low_pass = resample(resample(speech, 16000, 8000), 8000, 16000)
    correlation = np.corrcoef(received, low_pass)[0, 1]
    assert correlation > (0.999 if condition == "8k" else 0.99)


def _snr_db(clean: np.ndarray, noisy: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(clean**2) / np.sum((noisy - clean) ** 2)))


def test_mulaw_condition_has_the_quantisation_noise_of_g711(speech) -> None:
    narrow = resample(speech, 16000, 8000)
    pcm = np.clip(np.rint(narrow * 32768), -32768, 32767).astype("<i2").tobytes()
    reference = np.frombuffer(audioop.ulaw2lin(audioop.lin2ulaw(pcm, 2), 2), "<i2") / 32768
    expected_snr = _snr_db(narrow, reference)
    clean = apply_condition(speech, "8k")
    mulaw = apply_condition(speech, "8k-mulaw")
    assert 25 < expected_snr < 45
    assert _snr_db(clean, mulaw) == pytest.approx(expected_snr, abs=1.0)


def test_conditioned_set_keeps_references(eval_set) -> None:
    subset = eval_set[:3]
    for condition in CONDITIONS:
        result = conditioned(subset, condition)
        assert [u.reference for u in result] == [u.reference for u in subset]


def test_unknown_condition() -> None:
    with pytest.raises(ValueError, match="gsm"):
        apply_condition(np.zeros(160, np.float32), "gsm")
