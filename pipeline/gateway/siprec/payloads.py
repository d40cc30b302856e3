"""RTP payloads to 8 kHz μ-law (what the gateway's ``LegTimeline`` takes) and back (for the project's own
RTP sender), for the three codecs a SIPREC client offers for telephony: PCMU, PCMA and G.722.

All three carry one payload byte per 8 kHz RTP timestamp unit (G.722's RTP clock is 8000 by RFC 3551 §4.5.2
although it codes 16 kHz audio: 2 samples a byte), so a packet's μ-law is always exactly as long as its
payload and positions computed from timestamps stay exact whatever the codec.

G.722 is stateful (ADPCM predictors, and here a resampling filter), so each stream gets its own decoder or
encoder object; PCMU and PCMA are stateless and cheap (a ``bytes.translate`` per packet, no numpy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import G722
import numpy as np

from pipeline.audio.codecs import decode, encode

ENCODINGS = ("pcmu", "pcma", "g722")

G722_RATE = 16000
G722_BITRATE = 64000  # the only mode RTP uses (RFC 3551: 64 kbit/s, one byte per 8 kHz tick)

# The 16 kHz <-> 8 kHz filter: a Kaiser-windowed sinc, linear phase. Measured against the alternatives
# (soxr.ResampleStream emits in bursts of ~800 samples, so exactly one packet's worth per packet would
# need ~100 ms of priming delay; np.convolve with this filter is ~5 µs a 20 ms packet): flat to 3.4 kHz
# (-0.01 dB), -2 dB at 3.6 kHz, -58 dB at 4 kHz and below -67 dB from 4.4 kHz, so little of G.722's
# 4-8 kHz band aliases into the 8 kHz μ-law. 97 taps put the group delay at 48 samples at 16 kHz: a whole
# number (24) of 8 kHz samples.
_FIR_TAPS = 97
_FIR_CUTOFF_HZ = 3700.0
_KAISER_BETA = 5.65  # ~60 dB stopband
# The constant delay each direction adds, in 8 kHz samples (the audio comes out this much later than
# the timestamps say; 3 ms, and the same on every packet, so the timeline's positions stay consistent).
G722_DECODE_DELAY_SAMPLES = (_FIR_TAPS - 1) // 2 // 2
G722_ENCODE_DELAY_SAMPLES = (_FIR_TAPS - 1) // 2 // 2


def _lowpass() -> np.ndarray:
    offsets = np.arange(_FIR_TAPS) - (_FIR_TAPS - 1) / 2
    cutoff = 2 * _FIR_CUTOFF_HZ / G722_RATE
    taps = cutoff * np.sinc(cutoff * offsets) * np.kaiser(_FIR_TAPS, _KAISER_BETA)
    return taps / taps.sum()  # unity gain at DC


_LOWPASS = _lowpass()


def _alaw_to_ulaw_table() -> bytes:
    # Through the project's own G.711 tables, so A-law -> μ-law is exactly decode-A then encode-μ.
    return encode(decode(bytes(range(256)), "alaw"), "mulaw")


_ALAW_TO_ULAW = _alaw_to_ulaw_table()


class PayloadDecoder(Protocol):
    def to_ulaw(self, payload: bytes) -> bytes:
        """8 kHz μ-law for one packet's payload: exactly ``len(payload)`` bytes."""
        ...


class PcmuDecoder:
    def to_ulaw(self, payload: bytes) -> bytes:
        return payload


class PcmaDecoder:
    def to_ulaw(self, payload: bytes) -> bytes:
        return payload.translate(_ALAW_TO_ULAW)


class G722Decoder:
    """One stream's G.722 decoder: 16 kHz PCM, low-passed and decimated to 8 kHz, then μ-law. Its output
    lags the input by ``G722_DECODE_DELAY_SAMPLES`` (the filter's state carries it between packets)."""

    def __init__(self) -> None:
        self._codec = G722.G722(G722_RATE, G722_BITRATE)
        self._history: np.ndarray = np.zeros(_FIR_TAPS - 1)  # the last 16 kHz samples the filter still needs

    def to_ulaw(self, payload: bytes) -> bytes:
        if not payload:
            return b""
        pcm16k = np.frombuffer(self._codec.decode(payload), dtype=np.int16)
        signal = np.concatenate((self._history, pcm16k))
        self._history = signal[-(_FIR_TAPS - 1):]
        # Only every other output is kept, one per payload byte: len(signal) - taps + 1 = 2 * len(payload).
        pcm8k = np.convolve(signal, _LOWPASS, "valid")[::2]
        return encode(pcm8k / 32768.0, "mulaw")


class G722Encoder:
    """One stream's G.722 encoder: 8 kHz int16, upsampled to 16 kHz (zero-stuffed and low-passed), coded.
    Its output lags the input by ``G722_ENCODE_DELAY_SAMPLES``."""

    def __init__(self) -> None:
        self._codec = G722.G722(G722_RATE, G722_BITRATE)
        self._history: np.ndarray = np.zeros(_FIR_TAPS - 1)
        self._interpolator = 2 * _LOWPASS  # zero-stuffing halves the level; the gain of 2 restores it

    def __call__(self, samples_8k: np.ndarray) -> bytes:
        stuffed = np.zeros(2 * len(samples_8k))
        stuffed[::2] = samples_8k
        signal = np.concatenate((self._history, stuffed))
        self._history = signal[-(_FIR_TAPS - 1):]
        filtered = np.convolve(signal, self._interpolator, "valid")
        pcm16k = np.clip(np.rint(filtered), -32768, 32767).astype(np.int16)
        return bytes(self._codec.encode(pcm16k))


def decoder_for(encoding: str) -> PayloadDecoder:
    """A decoder for one stream of ``encoding`` (one of ``ENCODINGS``); a new object each call, since
    G.722's must not be shared between streams."""
    if encoding == "pcmu":
        return PcmuDecoder()
    if encoding == "pcma":
        return PcmaDecoder()
    if encoding == "g722":
        return G722Decoder()
    raise ValueError(f"unknown RTP payload encoding {encoding[:32]!r}; expected one of {', '.join(ENCODINGS)}")


def encoder_for(encoding: str) -> Callable[[np.ndarray], bytes]:
    """An encoder for one stream: 8 kHz int16 samples -> payload of ``len(samples)`` bytes. G.722's is a
    new stateful object each call (one per stream)."""
    if encoding == "pcmu":
        return _g711_encoder("mulaw")
    if encoding == "pcma":
        return _g711_encoder("alaw")
    if encoding == "g722":
        return G722Encoder()
    raise ValueError(f"unknown RTP payload encoding {encoding[:32]!r}; expected one of {', '.join(ENCODINGS)}")


def _g711_encoder(codec: str) -> Callable[[np.ndarray], bytes]:
    def encode_samples(samples_8k: np.ndarray) -> bytes:
        return encode(np.asarray(samples_8k, dtype=np.float64) / 32768.0, codec)

    return encode_samples
