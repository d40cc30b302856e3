"""Property-based fuzzing of the Avro decoder every worker runs on what producers put on the topics:
any bytes decode to a message or raise ``ContractError`` (the worker dead-letters it with that reason);
never another exception, never a hang."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.contracts import AudioFrame, CallEvent, ContractError, Serde

SERDE = Serde.from_settings()
FRAME = SERDE.encode(AudioFrame("call-1", "agent", 7, 140, 8000, "mulaw", b"\xff" * 160))
EVENT = SERDE.encode(CallEvent("call-1", "start", legs=["agent", "customer"], sample_rate=8000, encoding="mulaw"))


def decoded_or_refused(data: bytes) -> None:
    for cls in (AudioFrame, CallEvent):
        try:
            message = SERDE.decode(data, cls)
        except ContractError as exc:
            assert str(exc)
        else:
            assert isinstance(message, cls)


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_raise_a_contract_error(data: bytes) -> None:
    decoded_or_refused(data)


@given(st.sampled_from([FRAME, EVENT]), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
       st.integers(0, 400), st.binary(max_size=40))
def test_a_valid_message_with_bytes_changed_cut_or_added_decodes_or_raises_a_contract_error(
    message: bytes, changes: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    data = bytearray(message)
    for at, value in changes:  # the header kept: the body is what a corrupt producer gets wrong
        data[5 + at % (len(data) - 5)] = value
    decoded_or_refused(bytes(data[:max(5, len(data) - cut % len(data))]) + tail)
