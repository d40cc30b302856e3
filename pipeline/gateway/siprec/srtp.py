"""SDES-keyed SRTP for the recording server: which offered ``a=crypto`` line (RFC 4568) we take, the key we
answer with, and turning each received SRTP packet back into RTP (RFC 3711) before ``rtp.py`` parses it.

The cryptography is libsrtp's (through ``pylibsrtp``); this module owns the SDES side of it: reading
``inline:`` key parameters, refusing what we cannot honour (MKI, several master keys, unknown suites) so
the recorder can pick the next offered line instead of recording noise, and turning every libsrtp
failure into :class:`SrtpError`. A receiver takes any SSRC under its key, so an SBC failover that
changes a stream's SSRC mid-call keeps being recorded; the number of SSRCs is bounded.

SRTP arrives off the network, so :meth:`SrtpReceiver.unprotect` raises nothing but :class:`SrtpError` on
any bytes, and its message says which check failed. Key material never appears in a message or repr.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import pylibsrtp

from pipeline.gateway.siprec.rtp import HEADER_BYTES
from pipeline.gateway.siprec.sdp import Crypto

# Strongest first: RFC 4568 §6.2 defines both with the same key; the 80-bit tag is the one to prefer.
SUITES: tuple[str, ...] = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
_PROFILES = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
_TAG_BYTES = {"AES_CM_128_HMAC_SHA1_80": 10, "AES_CM_128_HMAC_SHA1_32": 4}
MASTER_KEY_BYTES = 16
MASTER_SALT_BYTES = 14
_KEY_SALT_BYTES = MASTER_KEY_BYTES + MASTER_SALT_BYTES
# RFC 4568 §6.2: the most SRTP packets either suite may protect under one master key.
MAX_LIFETIME = 2**48
MAX_KEY_PARAMS_CHARS = 256  # 40 base64 characters, a lifetime and an MKI fit many times over
MAX_TAG = 999_999_999  # RFC 4568 §9.1: a tag is 1-9 digits
# pylibsrtp works in a fixed 1500-byte buffer: an SRTP packet must fit it, and an RTP packet to protect
# must leave room for the trailer libsrtp may append (tag and MKI, 16 + 128 bytes).
MAX_SRTP_BYTES = 1500
MAX_RTP_BYTES = MAX_SRTP_BYTES - 144
# SSRCs one receiver accepts: a failover changes the SSRC a few times a call, not more. Each new SSRC
# costs libsrtp a stream, so a peer that keeps changing it is refused rather than growing memory.
MAX_SSRCS = 16


class SrtpError(ValueError):
    """A key, suite or packet we cannot use. ``reason`` is one word for a metric label: ``key``,
    ``suite``, ``malformed``, ``auth``, ``replay``, ``ssrc_limit`` or ``protect``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class KeyParams:
    """An ``inline:`` key parameter read: the master key and salt, and the lifetime if one was given.
    The lifetime is range-checked, not enforced: refusing packets past it would lose audio, and a
    sender that honours it re-keys with a re-INVITE (an offered 2^20 lasts ~5.8 h at 50 packets/s)."""

    key_salt: bytes = field(repr=False)
    lifetime: int | None


def key_params(crypto: Crypto) -> KeyParams:
    """The key of ``crypto`` (``inline:<base64 key||salt>[|lifetime]``); :class:`SrtpError` for an unknown
    suite, a key that is not 30 bytes of base64, an MKI, or several keys."""
    if crypto.suite not in _PROFILES:
        raise SrtpError(f"a=crypto tag {crypto.tag}: suite {crypto.suite[:40]!r} is not one of {SUITES}", "suite")
    text = crypto.key_params
    where = f"a=crypto tag {crypto.tag}"
    if len(text) > MAX_KEY_PARAMS_CHARS:
        raise SrtpError(f"{where}: key-params of {len(text)} characters, more than {MAX_KEY_PARAMS_CHARS}", "key")
    if not text.startswith("inline:"):
        raise SrtpError(f"{where}: key-params must start with 'inline:'", "key")
    if ";" in text:
        # Several master keys need an MKI in every packet to say which one is in use.
        raise SrtpError(f"{where}: several master keys (';') are not supported", "key")
    parts = text[len("inline:"):].split("|")
    if len(parts) > 3:
        raise SrtpError(f"{where}: key-params has {len(parts) - 1} '|' fields, at most 2 are defined", "key")
    key_salt = _key_salt(where, parts[0])
    lifetime: int | None = None
    for extra in parts[1:]:
        if ":" in extra:
            # An MKI adds bytes to every packet and names the key; we hold one key and do not parse them.
            raise SrtpError(f"{where}: an MKI ({extra[:20]!r}) is not supported", "key")
        if lifetime is not None:
            raise SrtpError(f"{where}: two lifetimes in key-params", "key")
        lifetime = _lifetime(where, extra)
    return KeyParams(key_salt, lifetime)


def _key_salt(where: str, text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, and non-ASCII text
        raise SrtpError(f"{where}: the inline key is not base64", "key") from None
    if len(raw) != _KEY_SALT_BYTES:
        raise SrtpError(f"{where}: the inline key is {len(raw)} bytes, expected {_KEY_SALT_BYTES} "
                        f"({MASTER_KEY_BYTES} key + {MASTER_SALT_BYTES} salt)", "key")
    return raw


def _lifetime(where: str, text: str) -> int:
    exponent = text.startswith("2^")
    digits = text[2:] if exponent else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 15:
        raise SrtpError(f"{where}: lifetime must be '2^N' or a number, got {text[:20]!r}", "key")
    value = 2 ** min(int(digits), 64) if exponent else int(digits)
    if not 0 < value <= MAX_LIFETIME:
        raise SrtpError(f"{where}: lifetime {text[:20]!r} is outside 1..2^48 packets", "key")
    return value


def supported(crypto: Crypto) -> bool:
    """Whether we can receive with ``crypto``: a suite in :data:`SUITES` and key params we can use."""
    try:
        key_params(crypto)
    except SrtpError:
        return False
    return True


def choose(offered: Sequence[Crypto]) -> Crypto | None:
    """The first offered line we support (RFC 4568 §7.1.1: the offerer lists them in its preference;
    the answerer takes one and echoes its tag), or None when there is none."""
    return next((crypto for crypto in offered if supported(crypto)), None)


def answer_crypto(chosen: Crypto) -> Crypto:
    """Our ``a=crypto`` for the answer to ``chosen``: same tag and suite, our own fresh key. We send no
    media, but RFC 4568 §6.1 has each direction keyed by its sender, so the answer must carry one."""
    key_params(chosen)  # refuse to answer a line we could not receive with
    return Crypto(chosen.tag, chosen.suite, _inline_key())


def new_crypto(tag: int = 1, suite: str = "AES_CM_128_HMAC_SHA1_80") -> Crypto:
    """A line with a fresh random key, for an offer the project's own client sends."""
    if suite not in _PROFILES:
        raise SrtpError(f"suite {suite[:40]!r} is not one of {SUITES}", "suite")
    if not 0 <= tag <= MAX_TAG:
        raise SrtpError(f"a=crypto tag {tag} is outside 0..{MAX_TAG}", "key")
    return Crypto(tag, suite, _inline_key())


def _inline_key() -> str:
    return "inline:" + base64.b64encode(secrets.token_bytes(_KEY_SALT_BYTES)).decode("ascii")


def _policy(crypto: Crypto, ssrc_type: int) -> pylibsrtp.Policy:
    # "Any" SSRC: the policy is a template libsrtp copies for each SSRC it meets under this key.
    return pylibsrtp.Policy(key=key_params(crypto).key_salt, ssrc_type=ssrc_type, srtp_profile=_PROFILES[crypto.suite])


def _packet_at(data: bytes) -> str:
    """Where a failed packet came from, for the message: its SSRC and sequence number (sent in clear)."""
    if len(data) < HEADER_BYTES:
        return ""
    return f" (SSRC {int.from_bytes(data[8:12], 'big'):#010x}, sequence {int.from_bytes(data[2:4], 'big')})"


class SrtpReceiver:
    """One received stream's SRTP, keyed by the offerer's chosen ``a=crypto`` line. One libsrtp session
    holds the replay window of every SSRC seen; not thread-safe (one stream, one reader)."""

    def __init__(self, crypto: Crypto) -> None:
        self.suite = crypto.suite
        self._session = pylibsrtp.Session(_policy(crypto, pylibsrtp.Policy.SSRC_ANY_INBOUND))
        self._shortest = HEADER_BYTES + _TAG_BYTES[crypto.suite]
        self._ssrcs: set[int] = set()

    def unprotect(self, data: bytes) -> bytes:
        """The RTP packet inside SRTP ``data``; :class:`SrtpError` when it fails authentication, is a
        replay, or is not an SRTP packet at all (the caller counts and drops it)."""
        size = len(data)
        if size < self._shortest:
            raise SrtpError(f"SRTP packet of {size} bytes is shorter than header + tag ({self._shortest})",
                            "malformed")
        if size > MAX_SRTP_BYTES:
            raise SrtpError(f"SRTP packet of {size} bytes is longer than {MAX_SRTP_BYTES}", "malformed")
        try:
            rtp: bytes = self._session.unprotect(bytes(data))
        except (pylibsrtp.Error, IndexError) as exc:
            # IndexError: pylibsrtp names libsrtp's status from a table; a newer libsrtp's code past its end.
            raise SrtpError(f"SRTP packet of {size} bytes{_packet_at(data)}: {exc}", _reason(str(exc))) from None
        ssrc = int.from_bytes(rtp[8:12], "big")
        if ssrc not in self._ssrcs:
            self._admit(ssrc, data)
        return rtp

    def _admit(self, ssrc: int, data: bytes) -> None:
        if len(self._ssrcs) < MAX_SSRCS:
            self._ssrcs.add(ssrc)
            return
        # libsrtp has just made a stream for it; dropping that keeps memory bounded while every SSRC
        # already admitted keeps its replay window.
        with contextlib.suppress(pylibsrtp.Error):  # nothing to free is as good as freed
            self._session.remove_stream(ssrc)
        raise SrtpError(f"SRTP packet{_packet_at(data)}: more than {MAX_SSRCS} SSRCs on one stream",
                        "ssrc_limit")


def _reason(libsrtp_message: str) -> str:
    if "replay" in libsrtp_message or "too old" in libsrtp_message:
        return "replay"
    if "authentication" in libsrtp_message:
        return "auth"
    return "malformed"


class SrtpSender:
    """Protects RTP under a given ``a=crypto`` line (the project's own client and the tests), any SSRC.
    A packet may be protected again (a resend): the receiver, not the sender, rejects the replay."""

    def __init__(self, crypto: Crypto) -> None:
        policy = _policy(crypto, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        policy.allow_repeat_tx = True
        self.suite = crypto.suite
        self._session = pylibsrtp.Session(policy)

    def protect(self, rtp: bytes) -> bytes:
        """The SRTP packet of RTP packet ``rtp``; :class:`SrtpError` if libsrtp will not protect it."""
        if not HEADER_BYTES <= len(rtp) <= MAX_RTP_BYTES:
            raise SrtpError(f"RTP packet of {len(rtp)} bytes: can protect {HEADER_BYTES}..{MAX_RTP_BYTES}",
                            "protect")
        try:
            srtp: bytes = self._session.protect(bytes(rtp))
        except (pylibsrtp.Error, IndexError) as exc:
            raise SrtpError(f"RTP packet of {len(rtp)} bytes{_packet_at(rtp)}: {exc}", "protect") from None
        return srtp
