"""Any recording format through libsndfile: files made from real speech by libsndfile itself, by FFmpeg's
encoders (LAME, libopus, its WAV muxer: what recorders and converters write) and by hand (a μ-law WAV
header over G.711 bytes), read back and compared with the speech they were made from."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile

from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError, load_audio
from pipeline.audio.resample import resample

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")


@pytest.fixture(scope="module")
def pcm16(cards_wav: Path) -> np.ndarray:
    """Two real 16 kHz 16-bit recordings as int16 [n, 2]: a stereo call's left and right leg."""
    left = soundfile.read(cards_wav, dtype="int16")[0]
    right = soundfile.read(LIBRIVOX, dtype="int16")[0][: left.size]
    return np.stack([left, right], axis=1)


@pytest.fixture(scope="module")
def speech(pcm16: np.ndarray) -> np.ndarray:
    """The same samples as float [n, 2], exactly as a 16-bit reader scales them."""
    return pcm16.astype(np.float32) / 32768


def _aligned_correlation(reference: np.ndarray, decoded: np.ndarray, max_lag: int) -> tuple[float, int]:
    """Best normalised correlation of two 1-D signals over lags of up to ``max_lag`` samples, and its lag
    (lossy codecs may add a few ms of delay)."""
    best = (-1.0, 0)
    for lag in range(-max_lag, max_lag + 1):
        a, b = (reference, decoded[lag:]) if lag >= 0 else (reference[-lag:], decoded)
        n = min(a.size, b.size)
        denominator = float(np.sqrt(np.dot(a[:n], a[:n]) * np.dot(b[:n], b[:n])))
        best = max(best, (float(np.dot(a[:n], b[:n])) / denominator, lag))
    return best


def _encode_with_ffmpeg(path: Path, samples: np.ndarray, rate: int, codec: str, container: str) -> Path:
    """``samples`` [n, channels] float, encoded by FFmpeg (PyAV) as a recorder or converter would."""
    layout = "stereo" if samples.shape[1] == 2 else "mono"
    pcm = codecs.float_to_pcm16(np.ascontiguousarray(samples).reshape(-1)).reshape(1, -1)
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout=layout)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return path


def _g711_wav(path: Path, payload: bytes, format_tag: int, channels: int, rate: int) -> Path:
    """A WAV file as telephony recorders write it: a WAVE_FORMAT_MULAW (7) / ALAW (6) header over G.711
    bytes (``wave`` refused exactly these: "unknown format: 7")."""
    fmt = struct.pack("<HHIIHHH", format_tag, channels, rate, rate * channels, channels, 8, 0)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<II", 4, len(payload) // channels)
    body += b"data" + struct.pack("<I", len(payload)) + payload
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


@pytest.mark.parametrize("container,subtype", [
    ("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "PCM_32"), ("WAV", "FLOAT"), ("WAV", "DOUBLE"),
    ("WAVEX", "PCM_24"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24"), ("AIFF", "PCM_16"), ("CAF", "PCM_16"),
])
def test_lossless_formats_give_back_exactly_the_samples(tmp_path, pcm16, speech, container, subtype) -> None:
    path = tmp_path / f"call.{container.lower()}"
    # libsndfile widens int16 to 24/32 bits and converts to float without loss
    data = speech if subtype in ("FLOAT", "DOUBLE") else pcm16
    soundfile.write(path, data, 16000, format=container, subtype=subtype)
    audio = load_audio(path)
    assert (audio.sample_rate, audio.channels, audio.format) == (16000, 2, f"{container}/{subtype}")
    np.testing.assert_array_equal(audio.samples, speech.T)
    assert audio.samples.dtype == np.float32 and audio.samples.flags.c_contiguous


def test_8_bit_pcm_is_within_one_step(tmp_path, pcm16, speech) -> None:
    path = tmp_path / "u8.wav"
    soundfile.write(path, pcm16, 16000, subtype="PCM_U8")
    audio = load_audio(path)
    assert audio.format == "WAV/PCM_U8" and audio.samples.shape == speech.T.shape
    assert np.abs(audio.samples - speech.T).max() <= 1 / 128


@pytest.mark.parametrize("encoding,format_tag", [("mulaw", 7), ("alaw", 6)])
def test_g711_wav_from_a_recorder_decodes_like_the_raw_g711_path(tmp_path, speech, encoding, format_tag) -> None:
    at_8k = resample(speech.T, 16000, 8000)
    payload = codecs.encode(np.ascontiguousarray(at_8k.T).reshape(-1), encoding)  # interleaved, as in a file
    audio = load_audio(_g711_wav(tmp_path / "call.wav", payload, format_tag, 2, 8000))
    assert (audio.sample_rate, audio.channels) == (8000, 2)
    assert audio.format == f"WAV/{'ULAW' if encoding == 'mulaw' else 'ALAW'}"
    expected = codecs.decode(payload, encoding).reshape(-1, 2).T
    np.testing.assert_array_equal(audio.samples, expected)
    # and the same bytes without a header, through the raw path, are the same samples
    raw = tmp_path / f"left.{'ulaw' if encoding == 'mulaw' else 'alaw'}"
    raw.write_bytes(payload[0::2])
    np.testing.assert_array_equal(load_audio(raw).samples[0], expected[0])


@pytest.mark.parametrize("subtype", ["ULAW", "ALAW"])
def test_g711_wav_written_by_libsndfile_keeps_the_speech(tmp_path, speech, subtype) -> None:
    path = tmp_path / "call.wav"
    at_8k = resample(speech.T, 16000, 8000)
    soundfile.write(path, at_8k.T, 8000, subtype=subtype)
    audio = load_audio(path)
    error = audio.samples - at_8k
    snr_db = 10 * np.log10(np.sum(at_8k**2) / np.sum(error**2))
    assert snr_db > 30  # G.711 gives speech ~35-38 dB


@pytest.mark.parametrize("writer,container,codec,rate", [
    ("libsndfile", "MP3", "MPEG_LAYER_III", 16000),
    ("libsndfile", "OGG", "VORBIS", 16000),
    ("libsndfile", "OGG", "OPUS", 16000),
    ("ffmpeg", "mp3", "libmp3lame", 16000),
    ("ffmpeg", "ogg", "libopus", 48000),
    ("ffmpeg", "wav", "pcm_mulaw", 8000),
])
def test_lossy_formats_keep_both_legs_speech(tmp_path, speech, writer, container, codec, rate) -> None:
    source = resample(speech.T, 16000, rate).T if rate != 16000 else speech
    path = tmp_path / f"call.{container.lower()}"
    if writer == "libsndfile":
        soundfile.write(path, source, rate, format=container, subtype=codec)
    else:
        _encode_with_ffmpeg(path, source, rate, codec, container)
    audio = load_audio(path)
    assert (audio.sample_rate, audio.channels) == (rate, 2)
    assert abs(audio.samples.shape[1] - source.shape[0]) <= rate * 0.03  # codec padding: a few ms
    max_lag = rate * 30 // 1000
    for leg in (0, 1):
        same, lag = _aligned_correlation(source[:, leg], audio.samples[leg], max_lag)
        crossed, _ = _aligned_correlation(source[:, 1 - leg], audio.samples[leg], max_lag)
        assert same > 0.95 and abs(lag) <= max_lag, (leg, same, lag)
        assert crossed < 0.5  # the legs are not swapped or mixed


def test_any_sample_rate_is_kept_for_the_resampler(tmp_path, speech) -> None:
    for rate in (8000, 11025, 22050, 44100, 48000):
        path = tmp_path / f"call-{rate}.flac"
        at_rate = resample(speech.T, 16000, rate)
        soundfile.write(path, at_rate.T, rate, subtype="PCM_24")
        audio = load_audio(path)
        assert audio.sample_rate == rate and audio.samples.shape == at_rate.shape
        back = resample(audio.samples, rate, 16000)
        n = min(back.shape[1], speech.shape[0])
        assert _aligned_correlation(speech[:n, 0], back[0, :n], 2)[0] > 0.95  # 8 kHz keeps only 0-4 kHz


def test_the_name_does_not_matter_the_content_does(tmp_path, speech) -> None:
    path = tmp_path / "recording.wav"  # an MP3 under a .wav name, as exports often are
    soundfile.write(path, speech, 16000, format="MP3")
    assert load_audio(path).format == "MP3/MPEG_LAYER_III"
    bare = tmp_path / "recording"
    soundfile.write(bare, speech, 16000, format="FLAC")
    np.testing.assert_array_equal(load_audio(bare).samples, speech.T)


def test_float_wav_beyond_full_scale_is_clipped_and_nan_is_refused(tmp_path, speech) -> None:
    loud = tmp_path / "loud.wav"
    soundfile.write(loud, 3.0 * speech, 16000, subtype="FLOAT")
    samples = load_audio(loud).samples
    assert samples.max() == 1.0 and samples.min() == -1.0
    broken = tmp_path / "nan.wav"
    data = speech.copy()
    data[100, 1] = np.nan
    soundfile.write(broken, data, 16000, subtype="FLOAT")
    with pytest.raises(AudioFileError, match=r"nan\.wav.*not numbers"):
        load_audio(broken)


# ---- what cannot be read: one line naming the file and the cause, and nothing else on stderr -------
def _one_line_error(path: Path, capfd: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(AudioFileError) as info:
        load_audio(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert capfd.readouterr().err == ""  # the MPEG decoder's own chatter does not leak out
    return info.value.reason


def test_corrupt_flac_says_where_the_good_audio_ends(tmp_path, speech, capfd) -> None:
    good = tmp_path / "good.flac"
    soundfile.write(good, np.tile(speech, (4, 1)), 16000)  # ~4.4 s
    data = bytearray(good.read_bytes())
    damaged = tmp_path / "damaged.flac"
    start = len(data) * 3 // 4
    data[start:] = bytes(b ^ 0x5A for b in data[start:])
    damaged.write_bytes(bytes(data))
    reason = _one_line_error(damaged, capfd)
    assert reason.startswith("corrupt or truncated FLAC/PCM_16 data after ") and "lost sync" in reason
    truncated = tmp_path / "truncated.flac"
    truncated.write_bytes(good.read_bytes()[: len(data) // 2])
    assert "corrupt or truncated FLAC" in _one_line_error(truncated, capfd)


def test_mp3_with_garbage_inside_is_one_line_without_decoder_noise(tmp_path, speech, capfd) -> None:
    good = _encode_with_ffmpeg(tmp_path / "good.mp3", speech, 16000, "libmp3lame", "mp3")
    data = good.read_bytes()
    noise = np.random.default_rng(7).bytes(len(data) // 3)
    damaged = tmp_path / "damaged.mp3"
    damaged.write_bytes(data[: len(data) // 4] + noise + data[len(data) // 4 + len(noise):])
    assert "MP3" in _one_line_error(damaged, capfd)


@pytest.mark.parametrize("name,content,cause", [
    ("empty.wav", b"", "empty file (0 bytes)"),
    ("notes.wav", b"call notes: customer rang about a claim\n" * 20, "not a recognised audio format"),
    ("notes.mp3", b"call notes: customer rang about a claim\n" * 20, "not a recognised audio format"),
    ("tag.mp3", b"ID3", "not a recognised audio format"),
    ("noise.flac", np.random.default_rng(3).bytes(4000), "not a recognised audio format"),
])
def test_files_that_are_not_audio(tmp_path, capfd, name, content, cause) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert _one_line_error(path, capfd).startswith(cause)


def test_a_header_without_samples(tmp_path, capfd) -> None:
    path = tmp_path / "header-only.wav"
    soundfile.write(path, np.zeros((0, 2), np.float32), 8000, subtype="ULAW")
    assert _one_line_error(path, capfd).startswith("no audio samples in it (WAV/ULAW")


def test_a_sample_rate_no_speech_fits_in(tmp_path, capfd) -> None:
    path = tmp_path / "slow.wav"
    soundfile.write(path, np.zeros((100, 1), np.float32), 1000)
    assert "1000 Hz" in _one_line_error(path, capfd)


def test_missing_files_folders_and_pipes(tmp_path, capfd) -> None:
    assert _one_line_error(tmp_path / "absent.flac", capfd) == "no such file"
    (tmp_path / "calls.wav").mkdir()
    assert _one_line_error(tmp_path / "calls.wav", capfd) == "is a directory, not a file"
    os.mkfifo(tmp_path / "pipe.wav")  # opening it would wait for a writer forever
    assert _one_line_error(tmp_path / "pipe.wav", capfd) == "not a regular file"
