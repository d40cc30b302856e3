"""Checkpoints sealed at rest (pipeline/worker/checkpoint_cipher.py): AES-256-GCM, the call id bound, the
key named by its id (rotation), no plain record taken while a key is set (no downgrade)."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint, CheckpointSegment, LegCheckpoint
from pipeline.worker.checkpoint_cipher import (
    LEGACY_MAGIC,
    CheckpointCipher,
    CheckpointKeyError,
    SealedCheckpointError,
    parse_key,
)

KEY = base64.b64encode(os.urandom(32)).decode()


def _record() -> bytes:
    leg = LegCheckpoint(leg="agent", sample_rate=8000, encoding="mulaw", frame_ms=20, next_seq=9, frames_released=9,
                        samples_in=1440, samples_out=2880, resampler_history=b"\x01" * 64, vad_state=b"\x00" * 1024,
                        vad_context=b"\x00" * 256, vad_pending=b"", windows_done=5, last_end=0, emitted=0,
                        audio_start=0, audio=b"\x02" * 19200)
    segment = CheckpointSegment("c1/agent/000000000", "agent", 0, 900, "my account number is [ACCOUNT]")
    return Serde.from_settings().encode(CallCheckpoint("c1", "open", segments=[segment], legs=[leg]))


def test_a_sealed_record_hides_its_text_and_audio_and_opens_to_the_same_bytes() -> None:
    cipher, record = CheckpointCipher(KEY), _record()
    sealed = cipher.seal("c1", record)
    assert sealed.startswith(b"CQE2") and b"account number" not in sealed and b"\x02" * 64 not in sealed
    assert cipher.open("c1", sealed) == record
    assert cipher.seal("c1", record) != sealed  # a fresh nonce each time


def test_a_sealed_record_does_not_open_under_another_call_another_key_or_altered() -> None:
    sealed = CheckpointCipher(KEY).seal("c1", _record())
    with pytest.raises(SealedCheckpointError, match="call c2"):
        CheckpointCipher(KEY).open("c2", sealed)
    with pytest.raises(SealedCheckpointError, match="neither CALLQA_CHECKPOINT_KEY nor one of"):
        CheckpointCipher(os.urandom(32).hex()).open("c1", sealed)
    with pytest.raises(SealedCheckpointError):
        CheckpointCipher(KEY).open("c1", sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(SealedCheckpointError, match="CALLQA_CHECKPOINT_KEY is not set"):
        CheckpointCipher().open("c1", sealed)


def test_without_a_key_records_pass_through_and_with_one_a_plain_record_is_refused() -> None:
    """A plain record read with a key set is a forged resume state, or one written before the key: refused,
    unless the switch-over setting says to read those."""
    record = _record()
    assert CheckpointCipher().seal("c1", record) == record
    assert CheckpointCipher().open("c1", record) == record
    with pytest.raises(SealedCheckpointError, match="call c1 is not sealed although CALLQA_CHECKPOINT_KEY is set"):
        CheckpointCipher(KEY).open("c1", record)
    assert CheckpointCipher(KEY, plain_accepted=True).open("c1", record) == record


def test_a_rotated_key_still_opens_what_the_old_one_sealed_and_seals_with_the_new_one() -> None:
    old_key, new_key, record = KEY, base64.b64encode(os.urandom(32)).decode(), _record()
    sealed_old = CheckpointCipher(old_key).seal("c1", record)
    rotated = CheckpointCipher(new_key, previous_keys=f" {os.urandom(32).hex()}, {old_key}")
    assert rotated.open("c1", sealed_old) == record
    sealed_new = rotated.seal("c1", record)
    assert sealed_new[4:8] != sealed_old[4:8]  # another key id
    assert CheckpointCipher(new_key).open("c1", sealed_new) == record
    with pytest.raises(SealedCheckpointError, match="sealed with key"):
        CheckpointCipher(new_key).open("c1", sealed_old)  # the old key dropped too early: named, not guessed
    with pytest.raises(CheckpointKeyError, match="without CALLQA_CHECKPOINT_KEY"):
        CheckpointCipher("", previous_keys=old_key)


def test_a_record_sealed_before_key_ids_opens_with_the_current_or_a_previous_key() -> None:
    record, nonce = _record(), os.urandom(12)
    legacy = LEGACY_MAGIC + nonce + AESGCM(parse_key(KEY)).encrypt(nonce, record, b"c1")  # the CQE1 layout
    assert CheckpointCipher(KEY).open("c1", legacy) == record
    assert CheckpointCipher(os.urandom(32).hex(), previous_keys=KEY).open("c1", legacy) == record
    with pytest.raises(SealedCheckpointError, match="does not open"):
        CheckpointCipher(os.urandom(32).hex()).open("c1", legacy)


@pytest.mark.parametrize("bad", ["short", "00" * 31, base64.b64encode(b"x" * 31).decode()])
def test_a_key_that_is_not_32_bytes_is_refused_with_how_to_make_one(bad: str) -> None:
    with pytest.raises(CheckpointKeyError, match="32 bytes"):
        CheckpointCipher(bad)
