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
def test_streaming_agrees_with_one_shot(sr_in, sr_out, chunk, goforward_raw) -> None:
    """The streaming filter (exact, restorable) and soxr's one-shot one differ only near Nyquist:
    same length, same timing (a shift of one sample would leave a difference near 0 dB)."""
    speech = resample(load_audio(goforward_raw).samples[0], 16000, sr_in)
    stream = StreamResampler(sr_in, sr_out)
    pieces = [stream.process(speech[i:i + chunk]) for i in range(0, speech.size, chunk)]
    streamed = np.concatenate([*pieces, stream.flush()])
    one_shot = resample(speech, sr_in, sr_out)
    assert streamed.size == one_shot.size
    difference_db = 20 * np.log10(np.std(streamed - one_shot) / np.std(one_shot))
    assert difference_db < -30


@pytest.mark.parametrize("sr_in", [8000, 11025, 48000])
def test_streaming_output_does_not_depend_on_chunking(sr_in: int) -> None:
    x = np.random.default_rng(sr_in).standard_normal(sr_in * 2).astype(np.float32) * 0.1
    outputs = []
    for seed in (1, 2, 3):
        cuts = np.sort(np.random.default_rng(seed).integers(0, x.size, size=150))
        stream = StreamResampler(sr_in, 16000)
        outputs.append(np.concatenate([stream.process(c) for c in np.split(x, cuts)] + [stream.flush()]))
    assert all(np.array_equal(outputs[0], other) for other in outputs[1:])


def test_streaming_passband_and_images() -> None:
    """8 -> 16 kHz: the telephone band passes at unit gain, images above 4 kHz are gone."""
    stream = StreamResampler(8000, 16000)
    for freq in (300, 1000, 3000):
        tone = _tone(freq, 8000)
        up = np.concatenate([stream.process(tone), stream.flush()])[800:-800]
        assert abs(np.std(up) / np.std(tone[400:-400]) - 1) < 1e-3
        spectrum = np.abs(np.fft.rfft(up * np.hanning(up.size)))
        freqs = np.fft.rfftfreq(up.size, 1 / 16000)
        assert spectrum[freqs > 4400].max() < spectrum.max() * 1e-3  # -60 dB


def test_same_rate_is_a_copy() -> None:
    x = _tone(440, 8000)
    assert np.array_equal(resample(x, 8000, 8000), x)
    stream = StreamResampler(8000, 8000)
    assert np.array_equal(stream.process(x), x) and stream.flush().size == 0
