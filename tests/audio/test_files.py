"""Reading WAV, raw PCM and raw G.711 files (every other format: test_formats.py)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError, load_audio


def _write_wav(path: Path, frames: bytes, channels: int, width: int, rate: int) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(frames)
    return path


def test_real_16_bit_wavs_keep_their_rate_and_length(cards_wav, alsa_wav) -> None:
    for path in (cards_wav, alsa_wav):
        with wave.open(str(path), "rb") as wav:
            n, rate = wav.getnframes(), wav.getframerate()
        audio = load_audio(path)
        assert audio.samples.shape == (1, n)
        assert audio.sample_rate == rate
        assert audio.samples.dtype == np.float32
        assert 0.05 < np.abs(audio.samples).max() <= 1.0
        assert audio.path == str(path)


def test_raw_pcm_is_16_khz_s16le(goforward_raw) -> None:
    audio = load_audio(goforward_raw)
    assert audio.sample_rate == 16000
    assert audio.samples.shape == (1, goforward_raw.stat().st_size // 2)
    assert audio.duration_s == pytest.approx(goforward_raw.stat().st_size / 32000)


def test_stereo_wav_is_deinterleaved(tmp_path, cards_wav) -> None:
    speech = load_audio(cards_wav).samples[0]
    interleaved = np.stack([speech, -0.5 * speech], axis=1)
    path = _write_wav(tmp_path / "s.wav", codecs.encode(interleaved.ravel(), "pcm16"), 2, 2, 8000)
    audio = load_audio(path)
    assert audio.samples.shape == (2, speech.size) and audio.sample_rate == 8000
    np.testing.assert_allclose(audio.samples[0], speech, atol=1 / 32768)
    np.testing.assert_allclose(audio.samples[1], -0.5 * speech, atol=1 / 32768)


def test_8_bit_wav_is_unsigned(tmp_path) -> None:
    path = _write_wav(tmp_path / "u8.wav", bytes([0, 128, 255]), 1, 1, 8000)
    np.testing.assert_allclose(load_audio(path).samples[0], [-1.0, 0.0, 127 / 128])


@pytest.mark.parametrize("suffix,encoding", [(".ulaw", "mulaw"), (".mu", "mulaw"), (".alaw", "alaw"),
                                             (".al", "alaw")])
def test_raw_g711_is_8_khz(tmp_path, goforward_raw, suffix, encoding) -> None:
    speech = load_audio(goforward_raw).samples[0]
    payload = codecs.encode(speech, encoding)
    path = tmp_path / f"speech{suffix}"
    path.write_bytes(payload)
    audio = load_audio(path)
    assert audio.sample_rate == 8000
    np.testing.assert_array_equal(audio.samples[0], codecs.decode(payload, encoding))


def test_missing_file(tmp_path) -> None:
    with pytest.raises(AudioFileError, match="no such file"):
        load_audio(tmp_path / "absent.wav")


def test_unrecognised_content_names_file_and_reason(tmp_path) -> None:
    path = tmp_path / "call.mp3"
    path.write_bytes(b"ID3")
    with pytest.raises(AudioFileError) as info:
        load_audio(path)
    message = str(info.value)
    assert "call.mp3" in message and "not a recognised audio format" in message and "\n" not in message


def test_garbage_wav_is_reported(tmp_path) -> None:
    path = tmp_path / "broken.wav"
    path.write_bytes(b"this is not a RIFF file at all")
    with pytest.raises(AudioFileError, match="broken.wav"):
        load_audio(path)


def test_24_bit_wav_is_read(tmp_path) -> None:
    samples = [0, 1 << 22, -(1 << 23), (1 << 23) - 1]  # 0, +0.5, -1.0 and just under +1.0 of full scale
    frames = b"".join(v.to_bytes(3, "little", signed=True) for v in samples)
    audio = load_audio(_write_wav(tmp_path / "deep.wav", frames, 1, 3, 8000))
    np.testing.assert_array_equal(audio.samples[0], np.array(samples, np.float32) / (1 << 23))
    assert audio.format == "WAV/PCM_24"


def test_raw_pcm_with_odd_length_is_refused(tmp_path) -> None:
    path = tmp_path / "odd.raw"
    path.write_bytes(b"\x00\x01\x02")
    with pytest.raises(AudioFileError, match="odd.raw"):
        load_audio(path)
