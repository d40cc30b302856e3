"""One-shot and streaming resampling on real speech."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio.files import load_audio
from pipeline.audio.resample import StreamResampler, resample


def _tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_lengths_follow_the_rate_ratio(alsa_wav) -> None:
    speech = load_audio(alsa_wav).samples[0]
    for rate in (16000, 8000):
        out = resample(speech, 48000, rate)
        assert out.dtype == np.float32
        assert abs(out.size - speech.size * rate / 48000) <= 1


def test_tone_survives_and_aliases_are_removed() -> None:
    down = resample(_tone(1000, 16000), 16000, 8000)
    spectrum = np.abs(np.fft.rfft(down[800:-800] * np.hanning(down.size - 1600)))
    freqs = np.fft.rfftfreq(down.size - 1600, 1 / 8000)
    assert abs(freqs[spectrum.argmax()] - 1000) < 10
    # a 6 kHz tone is above the 4 kHz Nyquist of 8 kHz: it must be filtered, not folded to 2 kHz
    folded = resample(_tone(6000, 16000), 16000, 8000)
    assert np.sqrt(np.mean(folded[800:-800] ** 2)) < 1e-3


def test_multichannel_is_channels_first(cards_wav) -> None:
    speech = load_audio(cards_wav).samples[0]
    stereo = np.stack([speech, speech * 0.5])
    out = resample(stereo, 16000, 8000)
    assert out.shape[0] == 2
    np.testing.assert_allclose(out[1], 0.5 * out[0], atol=1e-6)
    np.testing.assert_allclose(out[0], resample(speech, 16000, 8000), atol=1e-6)


@pytest.mark.parametrize("sr_in,sr_out,chunk", [(8000, 16000, 160), (16000, 8000, 320), (48000, 16000, 997)])
def test_streaming_matches_one_shot(sr_in, sr_out, chunk, goforward_raw) -> None:
    speech = resample(load_audio(goforward_raw).samples[0], 16000, sr_in)
    stream = StreamResampler(sr_in, sr_out)
    pieces = [stream.process(speech[i:i + chunk]) for i in range(0, speech.size, chunk)]
    streamed = np.concatenate([*pieces, stream.flush()])
    one_shot = resample(speech, sr_in, sr_out)
    assert streamed.size == one_shot.size
    np.testing.assert_allclose(streamed, one_shot, atol=1e-5)


def test_same_rate_is_a_copy() -> None:
    x = _tone(440, 8000)
    assert np.array_equal(resample(x, 8000, 8000), x)
    stream = StreamResampler(8000, 8000)
    assert np.array_equal(stream.process(x), x) and stream.flush().size == 0
