"""A call's recording as bytes: Ogg/Opus, stereo, agent left and customer right (the layout QA tools and
players expect of a two-leg call), at the legs' own rate. Every browser plays Ogg/Opus in <audio> (Safari
since 15); libsndfile (soundfile) writes and reads it, no ffmpeg needed."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

CHANNELS = ("agent", "customer")  # left, right
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
MEDIA_TYPE = "audio/ogg"
SUFFIX = ".ogg"


class RecordingError(ValueError):
    """A recording that cannot be written or read back; one line naming what."""


def encode_call(legs: dict[str, np.ndarray], rate: int, compression: float) -> bytes:
    """Stereo Ogg/Opus of the legs (float samples at ``rate``); a missing leg is a silent channel, a shorter
    one is padded with silence at its end."""
    if rate not in OPUS_RATES:
        raise RecordingError(f"Opus takes {', '.join(map(str, OPUS_RATES))} Hz, not {rate} Hz")
    n = max((len(x) for x in legs.values()), default=0)
    stereo = np.zeros((n, len(CHANNELS)), dtype=np.float32)
    for column, leg in enumerate(CHANNELS):
        if leg in legs:
            stereo[: len(legs[leg]), column] = legs[leg]
    out = io.BytesIO()
    with sf.SoundFile(out, "w", samplerate=rate, channels=len(CHANNELS), format="OGG", subtype="OPUS",
                      compression_level=compression) as f:
        f.write(np.clip(stereo, -1.0, 1.0))
    return out.getvalue()


def decode_call(data: bytes) -> tuple[dict[str, np.ndarray], int]:
    """The legs of a recording (float32) and their rate."""
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise RecordingError(f"not an Ogg/Opus recording: {exc}") from exc
    return {leg: np.ascontiguousarray(samples[:, i]) for i, leg in enumerate(CHANNELS) if i < samples.shape[1]}, rate


def crosstalk_db(source: dict[str, np.ndarray], heard: dict[str, np.ndarray], rate: int) -> float:
    """How loud a leg's channel is, where only the other leg spoke, against the other channel (the worse leg):
    about -40 dB when the channels are apart, 0 when the codec mixed them."""
    worst = -120.0
    for leg, other in (("agent", "customer"), ("customer", "agent")):
        n = min(len(heard[leg]), len(source[leg]), len(source[other]))
        only_other = (np.abs(source[leg][:n]) < 1e-3) & (np.abs(source[other][:n]) > 1e-2)
        if only_other.sum() < rate // 10:
            continue
        ratio = np.sum(heard[leg][:n][only_other] ** 2) / max(1e-12, float(np.sum(heard[other][:n][only_other] ** 2)))
        worst = max(worst, 10 * float(np.log10(max(ratio, 1e-12))))
    return round(worst, 1)
