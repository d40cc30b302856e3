"""Whisper's log-mel front end in numpy, frame for frame what faster-whisper feeds its encoder.

Whisper features: 25 ms periodic-Hann frames every 10 ms (n_fft 400, hop 160 at 16 kHz), power spectrum,
a Slaney-style mel filterbank (the one librosa and Whisper use), log10 floored at 1e-10, clamped at
(max - 8) per utterance, then scaled to (x + 4) / 4.

faster-whisper pads the audio with 160 zeros, drops the last STFT column, computes the clamp over
all remaining frames and then drops one more frame before encoding (its ``content_frames``). So an
utterance of n samples yields n // 160 frames here, and the clamp uses the one extra frame as well.
Padding to the model's window is done in feature space with zeros (faster-whisper's ``pad_or_trim``),
not by padding the audio: ``log_mel_batch`` does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_MELS = 80
CHUNK_FRAMES = 3000  # 30 s, the encoder window of every Whisper model

# Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above (27 mels per factor 6.4).
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
_LOG_MEL_PER_E = 27.0 / np.log(6.4)


def hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney mel of a frequency in Hz."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_START_MEL + _LOG_MEL_PER_E * np.log(np.maximum(hz, _LOG_START_HZ) / _LOG_START_HZ)
    return np.where(hz >= _LOG_START_HZ, logarithmic, linear)


def mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    """Frequency in Hz of a Slaney mel."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_START_HZ * np.exp((np.maximum(mel, _LOG_START_MEL) - _LOG_START_MEL) / _LOG_MEL_PER_E)
    return np.where(mel >= _LOG_START_MEL, logarithmic, linear)


@lru_cache(maxsize=4)
def mel_filterbank(n_mels: int = N_MELS, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Triangular filters [n_mels, n_fft // 2 + 1], area-normalised (Slaney), from 0 Hz to Nyquist."""
    bin_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    edges_hz = mel_to_hz(np.linspace(0.0, float(hz_to_mel(sample_rate / 2)), n_mels + 2))
    left, centre, right = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bin_hz[None, :] - left) / (centre - left)
    falling = (right - bin_hz[None, :]) / (right - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    # Scale each filter to unit area so wide high-frequency bands don't dominate.
    filters = (triangles * (2.0 / (right - left))).astype(np.float32)
    filters.setflags(write=False)  # shared through the cache
    return filters


@lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic Hann, as torch.hann_window


def frame_count(n_samples: int) -> int:
    """Frames the encoder sees for ``n_samples`` of 16 kHz audio."""
    return n_samples // HOP_LENGTH


def log_mel_spectrogram(audio_16k: np.ndarray, n_mels: int = N_MELS) -> np.ndarray:
    """Log-mel features [n_mels, len(audio) // 160] of one mono 16 kHz float signal, as float32."""
    audio = np.asarray(audio_16k, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {audio.shape}")
    if audio.size == 0:
        return np.zeros((n_mels, 0), dtype=np.float32)
    log_power = _log10_mel_power(_frames(audio), n_mels)
    return _scale(log_power, log_power.max())[:, : frame_count(audio.size)]


def log_mel_batch(
    segments: Sequence[np.ndarray], n_frames: int = CHUNK_FRAMES, n_mels: int = N_MELS
) -> np.ndarray:
    """Features of many segments as one batch [B, n_mels, n_frames], zero-padded (longer ones truncated).

    Each segment keeps its own clamp. A loop is as fast as fusing all frames into one FFT (measured on
    the evaluation recordings: the FFT is already vectorised over frames), so this stays simple.
    """
    batch = np.zeros((len(segments), n_mels, n_frames), dtype=np.float32)
    for i, segment in enumerate(segments):
        features = log_mel_spectrogram(segment, n_mels)[:, :n_frames]
        batch[i, :, : features.shape[1]] = features
    return batch


def _frames(audio: np.ndarray) -> np.ndarray:
    """Windowed frames [n // 160 + 1, 400]: 160 zeros appended, then centred with reflection."""
    padded = np.pad(np.pad(audio, (0, HOP_LENGTH)), N_FFT // 2, mode="reflect")
    count = frame_count(audio.size) + 1
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:count]
    return windows * _hann_window()


def _log10_mel_power(frames: np.ndarray, n_mels: int) -> np.ndarray:
    """log10 of mel power [n_mels, frames], floored at 1e-10."""
    spectrum = np.fft.rfft(frames, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    mel_power = mel_filterbank(n_mels) @ power.T
    return np.log10(np.maximum(mel_power, 1e-10))


def _scale(log_power: np.ndarray, maximum: float) -> np.ndarray:
    return ((np.maximum(log_power, maximum - 8.0) + 4.0) / 4.0).astype(np.float32)
