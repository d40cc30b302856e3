"""Telephony conditions of the evaluation audio, as the ASR receives them (16 kHz float32).

Narrow-band conditions go down to 8 kHz (16-bit linear, or G.711 mu-law through the real codec) and
come back up with the streaming resampler, in 20 ms frames, exactly as the pipeline hands a leg's
audio to the ASR; ``conditioned`` also keeps the 8 kHz samples received, which the worker's own path
(``pipeline.eval.systems.Ours``) takes as an 8 kHz leg, so its VAD runs at the rate the worker's does.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.resample import StreamResampler, resample
from pipeline.eval.dataset import SAMPLE_RATE, EvalUtterance

TELEPHONY_RATE = 8000
FRAME_MS = 20
CONDITIONS: dict[str, str | None] = {"16k": None, "8k": "pcm16", "8k-mulaw": "mulaw", "8k-alaw": "alaw"}


def apply_condition(audio_16k: np.ndarray, condition: str) -> np.ndarray:
    """``audio_16k`` as the ASR would receive it under ``condition`` (one of CONDITIONS)."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; expected one of {', '.join(CONDITIONS)}")
    if CONDITIONS[condition] is None:
        return np.asarray(audio_16k, dtype=np.float32).copy()
    return _upsample_in_frames(received_8k(audio_16k, condition))


def conditioned(utterances: list[EvalUtterance], condition: str) -> list[EvalUtterance]:
    """The utterances with their audio under ``condition`` (and, narrow-band, the 8 kHz samples received)."""
    if CONDITIONS.get(condition) is None:
        return [replace(u, audio=apply_condition(u.audio, condition)) for u in utterances]
    out = []
    for u in utterances:
        received = received_8k(u.audio, condition)
        out.append(replace(u, audio=_upsample_in_frames(received), narrow=received))
    return out


def received_8k(audio_16k: np.ndarray, condition: str) -> np.ndarray:
    """The 8 kHz samples a narrow-band ``condition`` delivers (decoded), before they are upsampled."""
    encoding = CONDITIONS[condition]
    if encoding is None:
        raise ValueError(f"condition {condition!r} is not narrow-band")
    return codecs.decode(codecs.encode(resample(audio_16k, SAMPLE_RATE, TELEPHONY_RATE), encoding), encoding)


def _upsample_in_frames(audio_8k: np.ndarray) -> np.ndarray:
    stream = StreamResampler(TELEPHONY_RATE, SAMPLE_RATE)
    frame = TELEPHONY_RATE * FRAME_MS // 1000
    pieces = [stream.process(audio_8k[i : i + frame]) for i in range(0, audio_8k.size, frame)]
    return np.concatenate([*pieces, stream.flush()]).astype(np.float32)
