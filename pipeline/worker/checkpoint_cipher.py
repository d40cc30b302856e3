"""Checkpoints sealed at rest: AES-256-GCM over each record on the checkpoint topic.

An open call's checkpoint holds its redacted final texts so far and, per leg, the VAD's pre-roll audio
(300 ms of 16 kHz float32, the least that restores the next segment's audio exactly) and the resampler's
recent input: a voice sample and a transcript fragment of a live call, on a topic kept until the call is
committed past. With ``CALLQA_CHECKPOINT_KEY`` set (32 bytes, base64 or hex; every worker of the group
the same) every record is sealed: ``CQE2`` + the key's 4-byte id + 12-byte nonce + ciphertext and tag, the
call id bound as associated data (a record copied under another call's key does not open).

- **No downgrade.** With a key set, a plain record is refused (anyone who can write the topic could
  otherwise forge a call's resume state in plain Avro); ``CALLQA_CHECKPOINT_PLAIN_ACCEPTED`` reads them
  for the switch-over from no key, until the calls open before it have ended.
- **Rotation.** The key id names the key a record was sealed with: a new key goes in
  ``CALLQA_CHECKPOINT_KEY`` and the old one in ``CALLQA_CHECKPOINT_PREVIOUS_KEYS`` (comma-separated),
  still opened while records sealed with it remain (an open call's next checkpoint reseals it).
  ``CQE1`` records (the older format, with no key id) open with any of the keys.

Without a key records are plain Avro; a sealed record read without the key is an error naming the call,
not a silent skip.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"CQE2"  # never the start of a plain record: the Confluent wire format starts with byte 0
LEGACY_MAGIC = b"CQE1"  # sealed without a key id
KEY_ID_BYTES = 4
NONCE_BYTES = 12


class CheckpointKeyError(ValueError):
    """CALLQA_CHECKPOINT_KEY (or a previous key) is not a 32-byte key in base64 or hex."""


class SealedCheckpointError(RuntimeError):
    """A checkpoint record could not be opened (no key, another key, altered bytes, or plain with a key)."""


def parse_key(text: str, setting: str = "CALLQA_CHECKPOINT_KEY") -> bytes:
    """The 32 key bytes of ``text`` (hex or base64)."""
    text = text.strip()
    for decode in (bytes.fromhex, lambda t: base64.b64decode(t, validate=True)):
        try:
            key = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(key) == 32:
            return key
    raise CheckpointKeyError(f"{setting} must be 32 bytes, as 64 hex digits or base64 "
                             "(make one: python -c 'import os,base64; print(base64.b64encode(os.urandom(32)).decode())')")


def key_id(key: bytes) -> bytes:
    """A short public name of ``key`` (a hash prefix: says which key, reveals nothing of it)."""
    return hashlib.sha256(b"callqa checkpoint key id\0" + key).digest()[:KEY_ID_BYTES]


class CheckpointCipher:
    """Seals records with the current key and opens them with it or a previous one; with no key, passes
    them through (and refuses sealed ones)."""

    def __init__(self, key: str = "", previous_keys: str = "", plain_accepted: bool = False) -> None:
        previous = [parse_key(k, "CALLQA_CHECKPOINT_PREVIOUS_KEYS") for k in previous_keys.split(",") if k.strip()]
        if previous and not key:
            raise CheckpointKeyError("CALLQA_CHECKPOINT_PREVIOUS_KEYS is set without CALLQA_CHECKPOINT_KEY")
        keys = [parse_key(key), *previous] if key else []
        self._by_id = {key_id(k): AESGCM(k) for k in keys}
        self._current = (key_id(keys[0]), AESGCM(keys[0])) if keys else None
        self.plain_accepted = plain_accepted

    @property
    def sealing(self) -> bool:
        return self._current is not None

    def seal(self, call_id: str, record: bytes) -> bytes:
        if self._current is None:
            return record
        kid, aead = self._current
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + kid + nonce + aead.encrypt(nonce, record, call_id.encode())

    def open(self, call_id: str, stored: bytes) -> bytes:
        if stored.startswith(MAGIC):
            return self._open_sealed(call_id, stored)
        if stored.startswith(LEGACY_MAGIC):
            return self._open_legacy(call_id, stored)
        if self._current is not None and not self.plain_accepted:
            raise SealedCheckpointError(
                f"checkpoint of call {call_id} is not sealed although CALLQA_CHECKPOINT_KEY is set (forged, or "
                "written before the key: CALLQA_CHECKPOINT_PLAIN_ACCEPTED=true reads those during a switch-over)")
        return stored

    def _open_sealed(self, call_id: str, stored: bytes) -> bytes:
        self._require_key(call_id)
        kid = stored[len(MAGIC):len(MAGIC) + KEY_ID_BYTES]
        aead = self._by_id.get(kid)
        if aead is None:
            raise SealedCheckpointError(f"checkpoint of call {call_id} is sealed with key {kid.hex()}, neither "
                                        "CALLQA_CHECKPOINT_KEY nor one of CALLQA_CHECKPOINT_PREVIOUS_KEYS")
        body = stored[len(MAGIC) + KEY_ID_BYTES:]
        opened = _decrypt(aead, call_id, body)
        if opened is None:
            raise SealedCheckpointError(f"checkpoint of call {call_id} does not open with key {kid.hex()} (altered, "
                                        "or copied from another call)")
        return opened

    def _open_legacy(self, call_id: str, stored: bytes) -> bytes:
        self._require_key(call_id)
        for aead in self._by_id.values():
            opened = _decrypt(aead, call_id, stored[len(LEGACY_MAGIC):])
            if opened is not None:
                return opened
        raise SealedCheckpointError(f"checkpoint of call {call_id} does not open with CALLQA_CHECKPOINT_KEY or a "
                                    "previous key (another key, or altered)")

    def _require_key(self, call_id: str) -> None:
        if self._current is None:
            raise SealedCheckpointError(f"checkpoint of call {call_id} is sealed and CALLQA_CHECKPOINT_KEY is not set")


def _decrypt(aead: AESGCM, call_id: str, body: bytes) -> bytes | None:
    """``body`` (nonce + ciphertext and tag) opened, or None when it does not open."""
    try:
        return aead.decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:], call_id.encode())
    except InvalidTag:
        return None
