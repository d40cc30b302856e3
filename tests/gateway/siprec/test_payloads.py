"""Payload decoders to 8 kHz μ-law and the sender's encoders: PCMA goes through the project's G.711
tables exactly, G.722 keeps a tone's frequency through its 16 kHz -> 8 kHz filter without aliasing its
upper band, and every packet's μ-law is exactly as long as its payload."""

from __future__ import annotations

import G722
import numpy as np
import pytest

from pipeline.audio.codecs import decode, encode
from pipeline.gateway.siprec.payloads import ENCODINGS, G722_DECODE_DELAY_SAMPLES, decoder_for, encoder_for

RATE = 8000


def _tone(frequency: float, seconds: float, rate: int = RATE, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.int16)


def _peak_hz(ulaw: bytes) -> float:
    samples = decode(ulaw, "mulaw").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / RATE)[int(np.argmax(spectrum))])


def _rms(ulaw: bytes) -> float:
    return float(np.sqrt(np.mean(decode(ulaw, "mulaw").astype(np.float64) ** 2)))


def test_every_encoding_has_a_decoder_and_an_encoder() -> None:
    for encoding in ENCODINGS:
        decoder_for(encoding)
        encoder_for(encoding)
    for bad in ("opus", "PCMU ", ""):
        with pytest.raises(ValueError, match="unknown RTP payload encoding"):
            decoder_for(bad)
        with pytest.raises(ValueError, match="unknown RTP payload encoding"):
            encoder_for(bad)


def test_pcmu_passes_through() -> None:
    payload = bytes(range(256))
    assert decoder_for("pcmu").to_ulaw(payload) == payload


def test_pcma_to_ulaw_equals_decoding_alaw_then_encoding_ulaw_for_all_256_codes() -> None:
    every_code = bytes(range(256))
    expected = encode(decode(every_code, "alaw"), "mulaw")
    assert decoder_for("pcma").to_ulaw(every_code) == expected
    # Byte by byte too: the table maps each code on its own.
    decoder = decoder_for("pcma")
    assert b"".join(decoder.to_ulaw(bytes([code])) for code in every_code) == expected


def test_g711_encoders_match_the_codec_tables() -> None:
    samples = np.random.default_rng(1).integers(-32768, 32767, 4000, dtype=np.int16)
    as_float = samples.astype(np.float32) / 32768
    assert encoder_for("pcmu")(samples) == encode(as_float, "mulaw")
    assert encoder_for("pcma")(samples) == encode(as_float, "alaw")


def test_g722_1khz_tone_decodes_to_1khz_at_8khz_with_one_byte_per_payload_byte() -> None:
    encode_leg = encoder_for("g722")
    decoder = decoder_for("g722")
    tone = _tone(1000, 2.0)
    out = []
    for start in range(0, len(tone), 160):
        payload = encode_leg(tone[start:start + 160])
        assert len(payload) == 160
        ulaw = decoder.to_ulaw(payload)
        assert len(ulaw) == len(payload)
        out.append(ulaw)
    audio = b"".join(out)[RATE // 10:]  # past the codec's adaptation at the start
    assert abs(_peak_hz(audio) - 1000) <= 2
    # The tone comes out at about its level (G.722 at 64 kbit/s is near-transparent at 1 kHz).
    assert 0.8 < _rms(audio) * 32768 / (8000 / np.sqrt(2)) < 1.2


def test_g722_output_length_is_exact_for_any_payload_length() -> None:
    decoder = decoder_for("g722")
    rng = np.random.default_rng(2)
    for size in (0, 1, 37, 160, 161, 240, 320):
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert len(decoder.to_ulaw(payload)) == size


def test_g722_upper_band_does_not_alias_into_8khz() -> None:
    # A 6 kHz tone in G.722's 16 kHz audio would fold to 2 kHz if decimated without a low-pass.
    wideband = G722.G722(16000, 64000)
    tone_6k = _tone(6000, 1.0, rate=16000)
    tone_1k = _tone(1000, 1.0, rate=16000)
    decoder_6k, decoder_1k = decoder_for("g722"), decoder_for("g722")
    out_6k = b"".join(decoder_6k.to_ulaw(bytes(wideband.encode(tone_6k[i:i + 320]))) for i in range(0, 16000, 320))
    wideband = G722.G722(16000, 64000)
    out_1k = b"".join(decoder_1k.to_ulaw(bytes(wideband.encode(tone_1k[i:i + 320]))) for i in range(0, 16000, 320))
    assert len(out_6k) == len(out_1k) == 8000
    level_db = 20 * np.log10(_rms(out_6k[800:]) / _rms(out_1k[800:]))
    assert level_db < -40


def test_g722_decoders_are_one_per_stream() -> None:
    assert decoder_for("g722") is not decoder_for("g722")
    assert encoder_for("g722") is not encoder_for("g722")


def test_g722_round_trip_lags_by_a_constant_delay() -> None:
    # The filter's delay is the same on every packet, so timestamps stay consistent across a stream.
    rng = np.random.default_rng(3)
    noise = np.convolve(rng.normal(0, 3000, RATE * 2), np.ones(4) / 4, "same").astype(np.int16)
    encode_leg, decoder = encoder_for("g722"), decoder_for("g722")
    ulaw = b"".join(decoder.to_ulaw(encode_leg(noise[i:i + 160])) for i in range(0, len(noise), 160))
    received = decode(ulaw, "mulaw").astype(np.float64)
    sent = noise.astype(np.float64) / 32768
    lags = []
    for start in (2000, 6000, 10000):
        window = sent[start:start + 2000]
        scores = [float(np.dot(window, received[start + lag:start + lag + 2000])) for lag in range(0, 100)]
        lags.append(int(np.argmax(scores)))
    assert len(set(lags)) == 1 and lags[0] >= 2 * G722_DECODE_DELAY_SAMPLES
    print(f"G.722 encode+decode round trip: {lags[0]} samples at 8 kHz")
