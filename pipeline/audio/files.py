"""Reading audio files: every container and coding libsndfile reads, and headerless telephony dumps.

libsndfile (through ``soundfile``, whose wheels bundle it with its FLAC, Vorbis, Opus and MPEG
decoders) reads WAV in 8/16/24/32-bit PCM, float, μ-law and A-law, FLAC, OGG Vorbis and Opus, MP3,
AIFF, CAF and more, at any rate and channel count; the content decides, not the file name. Headerless
files carry no rate or coding, so for them the suffix decides (``RAW_FORMATS``).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from pipeline.audio import codecs

# Headerless files: suffix -> (encoding, sample rate).
RAW_FORMATS: dict[str, tuple[str, int]] = {
    ".raw": ("pcm16", 16000),
    ".pcm": ("pcm16", 16000),
    ".ulaw": ("mulaw", 8000),
    ".mu": ("mulaw", 8000),
    ".alaw": ("alaw", 8000),
    ".al": ("alaw", 8000),
}
READABLE = (
    "WAV (8/16/24/32-bit PCM, float, μ-law, A-law), FLAC, OGG Vorbis/Opus, MP3, AIFF, CAF; headerless "
    ".raw/.pcm (16 kHz 16-bit), .ulaw/.mu and .alaw/.al (8 kHz G.711)"
)
# Below 4 kHz nothing of speech is left; above 384 kHz a header is more likely wrong than the file real.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 384000


class AudioFileError(Exception):
    """An audio file that cannot be read, with the file and the reason."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"cannot read audio file {str(path)!r}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class LoadedAudio:
    """Samples of one file: float32 in [-1, 1], shape [channels, n], at the file's own rate."""

    samples: np.ndarray
    sample_rate: int
    path: str
    format: str = ""  # what was read, e.g. "WAV/ULAW", "MP3/MPEG_LAYER_III", "raw/mulaw"

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
    """Read ``path``; raise AudioFileError (one line: the file and the cause) when it cannot be used."""
    path = Path(path)
    _check_regular_file(path)
    raw = RAW_FORMATS.get(path.suffix.lower())
    audio = _load_raw(path, *raw) if raw else _load_sndfile(path)
    if audio.samples.shape[1] == 0:
        raise AudioFileError(path, f"no audio samples in it ({audio.format}: only a header, or cut off)")
    return audio


def _check_regular_file(path: Path) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise AudioFileError(path, "no such file") from None
    except OSError as exc:
        raise AudioFileError(path, (exc.strerror or type(exc).__name__).lower()) from exc
    if stat.S_ISDIR(info.st_mode):
        raise AudioFileError(path, "is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
        raise AudioFileError(path, "not a regular file")
    if info.st_size == 0:
        raise AudioFileError(path, "empty file (0 bytes)")
    if not os.access(path, os.R_OK):
        raise AudioFileError(path, "permission denied")


def _load_raw(path: Path, encoding: str, rate: int) -> LoadedAudio:
    try:
        payload = path.read_bytes()
    except OSError as exc:
        raise AudioFileError(path, (exc.strerror or type(exc).__name__).lower()) from exc
    width = codecs.bytes_per_sample(encoding)
    if len(payload) % width:
        raise AudioFileError(path, f"{len(payload)} bytes is not a whole number of {encoding} samples")
    return LoadedAudio(codecs.decode(payload, encoding)[np.newaxis, :], rate, str(path), f"raw/{encoding}")


def _load_sndfile(path: Path) -> LoadedAudio:
    with _native_stderr_silenced():
        try:
            sound = soundfile.SoundFile(str(path))
        except soundfile.SoundFileError as exc:
            raise AudioFileError(path, _open_failure(exc)) from None
        with sound:
            kind, rate = f"{sound.format}/{sound.subtype}", int(sound.samplerate)
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
                raise AudioFileError(path, f"{kind} at {rate} Hz: the sample rate must be "
                                           f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz")
            frames = _read_blocks(path, sound, kind)
    if not np.isfinite(frames).all():
        raise AudioFileError(path, f"{kind}: samples that are not numbers (NaN or infinity)")
    # Float files may exceed full scale; the pipeline (and every telephony codec) clips there.
    np.clip(frames, -1.0, 1.0, out=frames)
    return LoadedAudio(np.ascontiguousarray(frames.T), rate, str(path), kind)


def _read_blocks(path: Path, sound: soundfile.SoundFile, kind: str) -> np.ndarray:
    """All frames, [n, channels] float32; a decoder error names the format and where it stopped.

    Read a second at a time: a header that claims more frames than the file holds costs no memory,
    and an error says to the second where the good audio ends.
    """
    blocks: list[np.ndarray] = []
    done = 0
    while True:
        try:
            block = sound.read(sound.samplerate, dtype="float32", always_2d=True)
        except soundfile.SoundFileError as exc:
            detail = _libsndfile_message(exc)
            where = f"after {done / sound.samplerate:.2f} s"
            raise AudioFileError(path, f"corrupt or truncated {kind} data {where} ({detail})") from None
        if not len(block):
            break
        blocks.append(block)
        done += len(block)
    if not blocks:
        return np.zeros((0, sound.channels), np.float32)
    return np.concatenate(blocks)


def _open_failure(exc: soundfile.SoundFileError) -> str:
    message = _libsndfile_message(exc)
    # libsndfile says "File does not exist or is not a regular file" for unrecognised data in a file
    # named .mp3; the file was checked above, so that text would only mislead.
    if "not recognised" in message.lower() or "does not exist" in message.lower():
        return f"not a recognised audio format (readable: {READABLE})"
    return f"unreadable audio ({message})"


def _libsndfile_message(exc: soundfile.SoundFileError) -> str:
    text = getattr(exc, "error_string", "") or str(exc)
    text = " ".join(text.split()).removeprefix("Error :").strip().rstrip(".")
    return "decoder error" if text.lower().startswith("unspecified internal error") else text


_stderr_lock = threading.Lock()


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null while libsndfile works.

    Its MPEG decoder (libmpg123, built in) prints resync notes and warnings straight to the process's
    stderr, a dozen lines for one damaged MP3, around the one line that names the file and the cause.
    Python code in other threads that writes to stderr meanwhile is silenced too, so this is kept to
    the open and decode of one file (and never used by the worker's frame path).
    """
    with _stderr_lock:
        if sys.stderr is not None:  # Python's buffered text belongs before the redirect, not in it
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: nothing to silence
            yield
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
