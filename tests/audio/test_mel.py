"""Whisper log-mel features against faster-whisper's reference feature extractor on real speech."""

from __future__ import annotations

import numpy as np
import pytest
from faster_whisper.audio import pad_or_trim
from faster_whisper.feature_extractor import FeatureExtractor

from pipeline.audio.mel import frame_count, log_mel_batch, log_mel_spectrogram, mel_filterbank


@pytest.fixture(scope="module")
def reference() -> FeatureExtractor:
    return FeatureExtractor()


def _encoder_input(reference: FeatureExtractor, audio: np.ndarray) -> np.ndarray:
    """What faster-whisper's transcribe() feeds the encoder for a clip shorter than 30 s."""
    features = reference(audio)
    content_frames = features.shape[-1] - 1
    return pad_or_trim(features[:, :content_frames])


@pytest.mark.parametrize("n_mels", [80, 128])
def test_filterbank_matches_faster_whisper(n_mels: int) -> None:
    expected = FeatureExtractor.get_mel_filters(16000, 400, n_mels=n_mels)
    np.testing.assert_allclose(mel_filterbank(n_mels), expected, atol=1e-6)


def test_features_match_faster_whisper_on_every_recording(reference, speech_recordings_16k) -> None:
    assert len(speech_recordings_16k) == 20
    for name, audio in speech_recordings_16k.items():
        features = log_mel_spectrogram(audio)
        expected = reference(audio)[:, :-1]
        assert features.dtype == np.float32
        assert features.shape == expected.shape == (80, frame_count(audio.size)), name
        np.testing.assert_allclose(features, expected, atol=1e-3, err_msg=name)


def test_batch_is_the_encoder_input_of_each_segment(reference, speech_recordings_16k) -> None:
    audios = list(speech_recordings_16k.values())[:6]
    batch = log_mel_batch(audios)
    assert batch.shape == (6, 80, 3000)
    for i, audio in enumerate(audios):
        np.testing.assert_allclose(batch[i], _encoder_input(reference, audio), atol=1e-3)


def test_batch_truncates_long_segments(speech_recordings_16k) -> None:
    audio = next(iter(speech_recordings_16k.values()))
    batch = log_mel_batch([audio, np.zeros(0, np.float32)], n_frames=50)
    np.testing.assert_array_equal(batch[0], log_mel_spectrogram(audio)[:, :50])
    assert not batch[1].any()


def test_clamp_limits_the_dynamic_range_to_8_decades(speech_recordings_16k) -> None:
    audio = speech_recordings_16k["goforward.raw"]
    with_silence = np.concatenate([np.zeros(16000, np.float32), audio])
    features = log_mel_spectrogram(with_silence)
    assert features.max() - features.min() == pytest.approx(2.0, abs=1e-5)  # 8 decades / 4
    assert np.allclose(features[:, 10:90], features.min())


def test_short_and_empty_audio(reference) -> None:
    assert log_mel_spectrogram(np.zeros(0, np.float32)).shape == (80, 0)
    tone = (0.1 * np.sin(np.arange(400) * 0.3)).astype(np.float32)
    np.testing.assert_allclose(log_mel_spectrogram(tone), reference(tone)[:, :-1], atol=1e-3)


def test_stereo_input_is_refused() -> None:
    with pytest.raises(ValueError, match="mono"):
        log_mel_spectrogram(np.zeros((2, 1600), np.float32))
