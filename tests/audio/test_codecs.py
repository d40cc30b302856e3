"""G.711 and PCM codecs against the reference implementation in Python 3.11's audioop."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.audio.files import load_audio

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ALL_PCM16 = np.arange(-32768, 32768, dtype=np.int16)
REFERENCE = {
    "mulaw": (audioop.lin2ulaw, audioop.ulaw2lin),
    "alaw": (audioop.lin2alaw, audioop.alaw2lin),
}


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_encode_is_bit_exact_for_every_16_bit_value(encoding: str) -> None:
    lin2law, _ = REFERENCE[encoding]
    expected = lin2law(ALL_PCM16.astype("<i2").tobytes(), 2)
    assert codecs.encode(codecs.pcm16_to_float(ALL_PCM16), encoding) == expected


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_decode_is_bit_exact_for_every_code(encoding: str) -> None:
    _, law2lin = REFERENCE[encoding]
    every_code = bytes(range(256))
    expected = np.frombuffer(law2lin(every_code, 2), dtype="<i2")
    decoded = codecs.decode(every_code, encoding)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(codecs.float_to_pcm16(decoded), expected)


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_real_speech_round_trip_matches_audioop(encoding: str, goforward_raw) -> None:
    speech = load_audio(goforward_raw).samples[0]
    lin2law, law2lin = REFERENCE[encoding]
    pcm = codecs.float_to_pcm16(speech).astype("<i2").tobytes()
    payload = codecs.encode(speech, encoding)
    assert payload == lin2law(pcm, 2)
    expected = np.frombuffer(law2lin(payload, 2), dtype="<i2")
    np.testing.assert_array_equal(codecs.float_to_pcm16(codecs.decode(payload, encoding)), expected)


def test_pcm16_round_trip_is_lossless_and_little_endian() -> None:
    payload = ALL_PCM16.astype("<i2").tobytes()
    decoded = codecs.decode(payload, "pcm16")
    assert decoded.min() == -1.0 and decoded.max() < 1.0
    assert codecs.encode(decoded, "pcm16") == payload
    assert codecs.decode(b"\x01\x00", "pcm16")[0] == pytest.approx(1 / 32768)


def test_encode_clips_out_of_range_samples() -> None:
    pcm = np.frombuffer(codecs.encode(np.array([2.0, -2.0, 1.0]), "pcm16"), dtype="<i2")
    assert pcm.tolist() == [32767, -32768, 32767]


def test_bytes_per_sample() -> None:
    assert [codecs.bytes_per_sample(e) for e in ("pcm16", "mulaw", "alaw")] == [2, 1, 1]


@pytest.mark.parametrize("call", [
    lambda: codecs.decode(b"\x00", "g729"),
    lambda: codecs.encode(np.zeros(1), "g729"),
    lambda: codecs.bytes_per_sample("g729"),
])
def test_unknown_encoding_is_named_in_the_error(call) -> None:
    with pytest.raises(ValueError, match="g729"):
        call()


def test_odd_pcm16_payload_is_rejected() -> None:
    with pytest.raises(ValueError, match="odd"):
        codecs.decode(b"\x00\x01\x02", "pcm16")
