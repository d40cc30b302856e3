"""Reading audio files: WAV (PCM), raw 16 kHz s16le, and raw 8 kHz G.711."""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import codecs

# Headerless files carry no rate or encoding, so the suffix decides: (encoding, sample rate).
RAW_FORMATS: dict[str, tuple[str, int]] = {
    ".raw": ("pcm16", 16000),
    ".pcm": ("pcm16", 16000),
    ".ulaw": ("mulaw", 8000),
    ".mu": ("mulaw", 8000),
    ".alaw": ("alaw", 8000),
    ".al": ("alaw", 8000),
}


class AudioFileError(Exception):
    """An audio file that cannot be read, with the file and the reason."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"cannot read audio file {str(path)!r}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class LoadedAudio:
    """Samples of one file: float32 in [-1, 1], shape [channels, n]."""

    samples: np.ndarray
    sample_rate: int
    path: str

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def duration_s(self) -> float:
        return self.samples.shape[1] / self.sample_rate

    def mono(self) -> np.ndarray:
        """The channels averaged into one float32 signal."""
        return self.samples.mean(axis=0, dtype=np.float32)


def load_audio(path: str | Path) -> LoadedAudio:
    """Read ``path``; raise AudioFileError when it is missing, unsupported or malformed."""
    path = Path(path)
    if not path.is_file():
        raise AudioFileError(path, "no such file")
    suffix = path.suffix.lower()
    if suffix == ".wav":
        return _load_wav(path)
    if suffix in RAW_FORMATS:
        return _load_raw(path, *RAW_FORMATS[suffix])
    supported = ", ".join([".wav", *RAW_FORMATS])
    raise AudioFileError(path, f"unsupported file type {suffix or '(none)'!r}; supported: {supported}")


def _load_wav(path: Path) -> LoadedAudio:
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise AudioFileError(path, f"not a readable PCM WAV file ({exc})") from exc
    if width not in (1, 2):
        raise AudioFileError(path, f"{8 * width}-bit WAV samples are not supported (8 or 16-bit PCM only)")
    usable = len(frames) - len(frames) % (width * channels)
    if width == 1:  # 8-bit WAV is unsigned, centred on 128
        pcm = (np.frombuffer(frames[:usable], dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    else:
        pcm = codecs.decode(frames[:usable], "pcm16")
    return LoadedAudio(_deinterleave(pcm, channels), rate, str(path))


def _load_raw(path: Path, encoding: str, rate: int) -> LoadedAudio:
    payload = path.read_bytes()
    width = codecs.bytes_per_sample(encoding)
    if len(payload) % width:
        raise AudioFileError(path, f"{len(payload)} bytes is not a whole number of {encoding} samples")
    return LoadedAudio(codecs.decode(payload, encoding)[np.newaxis, :], rate, str(path))


def _deinterleave(interleaved: np.ndarray, channels: int) -> np.ndarray:
    return np.ascontiguousarray(interleaved.reshape(-1, channels).T, dtype=np.float32)
