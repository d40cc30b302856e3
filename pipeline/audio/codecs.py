"""Telephony sample encodings: 16-bit PCM and ITU-T G.711 (mu-law, A-law), in numpy.

Encoding goes through a 65,536-entry table built once from the G.711 segment rules, so a frame is one
fancy-index; decoding goes through a 256-entry table. Both tables are bit-exact with the standard
(the same values as the reference C implementation behind Python's former ``audioop``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ENCODINGS = ("pcm16", "mulaw", "alaw")
_BYTES_PER_SAMPLE = {"pcm16": 2, "mulaw": 1, "alaw": 1}

# Mu-law adds this bias to the magnitude so every segment starts on a power of two.
_ULAW_BIAS = 0x84
# Largest 14-bit magnitude mu-law can represent before the bias would overflow segment 7.
_ULAW_CLIP = 8159
# Upper ends of the 8 segments, for mu-law in 14-bit and A-law in 13-bit magnitude.
_ULAW_SEGMENT_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def bytes_per_sample(encoding: str) -> int:
    """Bytes one sample takes in ``encoding``."""
    _check(encoding)
    return _BYTES_PER_SAMPLE[encoding]


def decode(payload: bytes, encoding: str) -> np.ndarray:
    """Samples of ``payload`` as float32 in [-1, 1]."""
    _check(encoding)
    if encoding == "pcm16":
        if len(payload) % 2:
            raise ValueError(f"pcm16 payload has an odd number of bytes ({len(payload)})")
        return pcm16_to_float(np.frombuffer(payload, dtype="<i2"))
    codes = np.frombuffer(payload, dtype=np.uint8)
    table = _ulaw_decode_table() if encoding == "mulaw" else _alaw_decode_table()
    return pcm16_to_float(table[codes])


def encode(samples: np.ndarray, encoding: str) -> bytes:
    """``samples`` (float in [-1, 1], clipped outside) as bytes of ``encoding``."""
    _check(encoding)
    pcm = float_to_pcm16(samples)
    if encoding == "pcm16":
        return pcm.astype("<i2").tobytes()
    table = _ulaw_encode_table() if encoding == "mulaw" else _alaw_encode_table()
    # Index by the unsigned view of the 16-bit value: 0..32767 then -32768..-1.
    return table[pcm.view(np.uint16)].tobytes()


def pcm16_to_float(pcm: np.ndarray) -> np.ndarray:
    """Signed 16-bit samples as float32 in [-1, 1)."""
    return (pcm.astype(np.float32) / np.float32(32768.0)).astype(np.float32)


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as int16, rounded to nearest and clipped."""
    scaled = np.rint(np.asarray(samples, dtype=np.float64) * 32768.0)
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def _check(encoding: str) -> None:
    if encoding not in _BYTES_PER_SAMPLE:
        raise ValueError(f"unknown audio encoding {encoding!r}; expected one of {', '.join(ENCODINGS)}")


def _segment(magnitude: np.ndarray, segment_end: np.ndarray) -> np.ndarray:
    """Index of the first segment whose end is >= magnitude (8 when none is)."""
    return np.searchsorted(segment_end, magnitude, side="left")


def _all_pcm16() -> np.ndarray:
    """Every int16 value, ordered by its unsigned 16-bit pattern (the encode-table index)."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int64)


@lru_cache(maxsize=1)
def _ulaw_encode_table() -> np.ndarray:
    value = _all_pcm16() >> 2  # mu-law works on 14-bit values
    mask = np.where(value < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(value), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = _segment(magnitude, _ULAW_SEGMENT_END)
    code = (seg << 4) | ((magnitude >> (np.minimum(seg, 7) + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


@lru_cache(maxsize=1)
def _alaw_encode_table() -> np.ndarray:
    value = _all_pcm16() >> 3  # A-law works on 13-bit values
    mask = np.where(value >= 0, 0xD5, 0x55)
    magnitude = np.where(value >= 0, value, -value - 1)
    seg = _segment(magnitude, _ALAW_SEGMENT_END)
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    code = (seg << 4) | ((magnitude >> shift) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


@lru_cache(maxsize=1)
def _ulaw_decode_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int64) & 0xFF
    magnitude = (((code & 0x0F) << 3) + _ULAW_BIAS) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS).astype(np.int16)


@lru_cache(maxsize=1)
def _alaw_decode_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int64) ^ 0x55
    seg = (code & 0x70) >> 4
    mantissa = (code & 0x0F) << 4
    magnitude = np.where(seg == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(seg - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)
