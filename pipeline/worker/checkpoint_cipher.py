"""Checkpoints sealed at rest: AES-256-GCM over each record on the checkpoint topic.

An open call's checkpoint holds its redacted final texts so far and, per leg, the VAD's pre-roll audio
(300 ms of 16 kHz float32, the least that restores the next segment's audio exactly) and the resampler's
recent input: a voice sample and a transcript fragment of a live call, on a topic kept until the call is
committed past. With ``CALLQA_CHECKPOINT_KEY`` set (32 bytes, base64 or hex; every worker of the group
the same) every record is sealed: ``CQE1`` + 12-byte nonce + ciphertext and tag, the call id bound as
associated data (a record copied under another call's key does not open). Without a key records are plain
Avro, as before; a sealed record read without the key is an error naming the call, not a silent skip.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"CQE1"  # never the start of a plain record: the Confluent wire format starts with byte 0
NONCE_BYTES = 12


class CheckpointKeyError(ValueError):
    """CALLQA_CHECKPOINT_KEY is not a 32-byte key in base64 or hex."""


class SealedCheckpointError(RuntimeError):
    """A sealed checkpoint could not be opened (no key, another key, or altered bytes)."""


def parse_key(text: str) -> bytes:
    """The 32 key bytes of ``text`` (hex or base64)."""
    text = text.strip()
    for decode in (bytes.fromhex, lambda t: base64.b64decode(t, validate=True)):
        try:
            key = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(key) == 32:
            return key
    raise CheckpointKeyError("CALLQA_CHECKPOINT_KEY must be 32 bytes, as 64 hex digits or base64 "
                             "(make one: python -c 'import os,base64; print(base64.b64encode(os.urandom(32)).decode())')")


class CheckpointCipher:
    """Seals and opens checkpoint records; with no key, passes them through (and refuses sealed ones)."""

    def __init__(self, key: str = "") -> None:
        self._aead = AESGCM(parse_key(key)) if key else None

    @property
    def sealing(self) -> bool:
        return self._aead is not None

    def seal(self, call_id: str, record: bytes) -> bytes:
        if self._aead is None:
            return record
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + nonce + self._aead.encrypt(nonce, record, call_id.encode())

    def open(self, call_id: str, stored: bytes) -> bytes:
        if not stored.startswith(MAGIC):
            return stored
        if self._aead is None:
            raise SealedCheckpointError(f"checkpoint of call {call_id} is sealed and CALLQA_CHECKPOINT_KEY is not set")
        nonce = stored[len(MAGIC):len(MAGIC) + NONCE_BYTES]
        try:
            return self._aead.decrypt(nonce, stored[len(MAGIC) + NONCE_BYTES:], call_id.encode())
        except InvalidTag:
            raise SealedCheckpointError(f"checkpoint of call {call_id} does not open with CALLQA_CHECKPOINT_KEY "
                                        "(another key, or altered)") from None
