"""Who may open a stream: checked on the HTTP upgrade request, before any websocket exists.

- Twilio signs the URL it connects to: ``X-Twilio-Signature`` = base64 HMAC-SHA1(auth token, the exact
  wss URL, no body). Behind a proxy that URL is the public one (``gateway_public_url``, else rebuilt
  from ``X-Forwarded-Proto``/``X-Forwarded-Host`` or ``Host``); like Twilio's own validator, the URL is
  tried with and without its default port.
- Genesys AudioHook sends ``X-API-KEY`` and an RFC 9421 signature (hmac-sha256, key = the base64-decoded
  client secret, ``keyid`` = the API key) over ``@request-target``, ``@authority``, the three
  ``audiohook-*`` headers and ``x-api-key``, with a ``nonce`` and its ``created`` time: a signature older
  than ``audiohook_signature_max_age_s`` (plus the clock skew), or a nonce seen before, is refused.

Refusals give the reason as a short label (for the counter and the log line), never a secret.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import hmac
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from http_message_signatures import HTTPMessageVerifier, InvalidSignature, MappingKeyResolver, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException

AUDIOHOOK_COVERED = ("@request-target", "@authority", "audiohook-organization-id", "audiohook-session-id",
                     "audiohook-correlation-id", "x-api-key")
MIN_NONCE_CHARS = 22  # Genesys's nonces are 128 random bits, base64url: 22 characters or more
DEFAULT_PORTS = {"ws": 80, "http": 80, "wss": 443, "https": 443}


@dataclass(frozen=True)
class PublicAddress:
    """The scheme and host callers used to reach the gateway, and the URL they used for a path."""

    scheme: str  # ws or wss
    host: str  # host[:port], as the caller wrote it
    prefix: str = ""  # a path the proxy strips before the gateway (from gateway_public_url)

    @classmethod
    def of_request(cls, headers: Mapping[str, str], configured: str, tls: bool) -> PublicAddress:
        if configured:
            parts = urlsplit(configured)
            scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
            return cls(scheme, parts.netloc, parts.path.rstrip("/"))
        proto = _first(headers.get("x-forwarded-proto", "")).lower()
        scheme = {"https": "wss", "wss": "wss", "http": "ws", "ws": "ws"}.get(proto, "wss" if tls else "ws")
        host = _first(headers.get("x-forwarded-host", "")) or headers.get("host", "")
        return cls(scheme, host)

    def url(self, target: str) -> str:
        """The public URL of a request target (path and query, as received)."""
        return f"{self.scheme}://{self.host}{self.prefix}{target}"


def _first(value: str) -> str:
    """A proxy chain appends: the first value is the one the caller sent."""
    return value.split(",")[0].strip()


# ---- Twilio -------------------------------------------------------------------------------------------
def twilio_signature(auth_token: str, url: str) -> str:
    digest = hmac.new(auth_token.encode(), url.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def twilio_refusal(auth_token: str, url: str, signature: str | None) -> str | None:
    """Why the Twilio handshake is refused (``missing_signature``, ``bad_signature``), or None."""
    if not signature:
        return "missing_signature"
    for candidate in _with_and_without_port(url):
        if hmac.compare_digest(twilio_signature(auth_token, candidate).encode(), signature.encode()):
            return None
    return "bad_signature"


def _with_and_without_port(url: str) -> list[str]:
    parts = urlsplit(url)
    default = DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    bare = urlunsplit(parts._replace(netloc=host))
    ported = urlunsplit(parts._replace(netloc=f"{host}:{default}"))
    if parts.port is None:
        return [url, ported] if default else [url]
    return [url, bare] if parts.port == default else [url]


# ---- AudioHook ----------------------------------------------------------------------------------------
class NonceCache:
    """Nonces seen within the signature age window; a second use is a replay. Bounded: the oldest
    entries go first (they are the ones about to expire anyway)."""

    def __init__(self, ttl_s: float, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()

    def first_use(self, nonce: str) -> bool:
        now = self.clock()
        while self._seen and (next(iter(self._seen.values())) <= now or len(self._seen) >= self.max_entries):
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return False
        self._seen[nonce] = now + self.ttl_s
        return True


@dataclass
class _SignedRequest:
    """What http-message-signatures reads from a request."""

    method: str
    url: str
    headers: Mapping[str, str]


class AudioHookAuthenticator:
    """The API key and, when a client secret is set, the signature of an AudioHook upgrade request."""

    def __init__(self, api_key: str, client_secret: str, max_age_s: float, clock_skew_s: float,
                 nonces: NonceCache | None = None) -> None:
        self.api_key = api_key
        try:
            self.secret = base64.b64decode(client_secret, validate=True) if client_secret else b""
        except (binascii.Error, ValueError):
            raise ValueError("CALLQA_AUDIOHOOK_CLIENT_SECRET is not base64") from None
        self.max_age = datetime.timedelta(seconds=max_age_s) if max_age_s > 0 else None
        self.clock_skew = datetime.timedelta(seconds=clock_skew_s)
        self.nonces = nonces or NonceCache(max_age_s + 2 * clock_skew_s)

    def refusal(self, target: str, authority: str, headers: Mapping[str, str]) -> str | None:
        """Why the handshake is refused (a short label), or None. ``target`` is the path and query."""
        key = headers.get("x-api-key", "")
        if self.api_key and not hmac.compare_digest(key.encode(), self.api_key.encode()):
            return "bad_api_key" if key else "missing_api_key"
        if not headers.get("audiohook-organization-id") or not headers.get("audiohook-session-id"):
            return "missing_headers"
        if not self.secret:
            return None
        if not _canonical_signatures(headers.get("signature", "")):
            return "bad_signature"
        try:
            nonce = self.verify(target, authority, headers, key)
        except InvalidSignature as exc:
            return "stale_signature" if "age" in str(exc) or "future" in str(exc) else "bad_signature"
        except (HTTPMessageSignaturesException, ValueError):
            return "bad_signature"
        if len(nonce) < MIN_NONCE_CHARS:
            return "short_nonce"
        if not self.nonces.first_use(nonce):
            return "replayed_nonce"
        return None

    def verify(self, target: str, authority: str, headers: Mapping[str, str], key_id: str) -> str:
        """The nonce of a valid signature by ``key_id`` covering every AudioHook component; raises
        ``InvalidSignature`` for a bad, stale or incomplete one."""
        verifier = HTTPMessageVerifier(signature_algorithm=algorithms.HMAC_SHA256,
                                       key_resolver=MappingKeyResolver(public_keys={key_id: self.secret},
                                                                       private_keys={}))
        verifier.max_clock_skew = self.clock_skew
        request = _SignedRequest("GET", f"https://{authority}{target}", headers)
        results = verifier.verify(request, max_age=self.max_age, require_components=AUDIOHOOK_COVERED)
        return results[0].nonce or ""


_SIGNATURE_VALUE = re.compile(r":([^:]*):")


def _canonical_signatures(header: str) -> bool:
    """Every byte sequence in a ``Signature`` header (``label=:base64:``) in canonical base64. A decoder
    ignores the unused low bits of the last character, so 'sig1=:...A=:' and '...B=:' carry the same
    signature; only the form the signer wrote is taken, and a signature changed anywhere is refused."""
    for value in _SIGNATURE_VALUE.findall(header):
        try:
            if base64.b64encode(base64.b64decode(value, validate=True)).decode() != value:
                return False
        except (binascii.Error, ValueError):
            return False
    return True


def audiohook_signed_headers(authority: str, target: str, api_key: str, client_secret: str,
                             audiohook_headers: Mapping[str, str], nonce: str | None = None) -> dict[str, str]:
    """The headers Genesys sends on an AudioHook upgrade: ``X-API-KEY``, the ``audiohook-*`` headers and,
    with a client secret, the RFC 9421 ``Signature-Input``/``Signature`` over every covered component
    (what ``AudioHookAuthenticator`` checks). For the simulator, and for testing a deployment."""
    from http_message_signatures import HTTPMessageSigner

    headers = {"Host": authority, "X-API-KEY": api_key, **audiohook_headers}
    if client_secret:
        request = _SignedRequest("GET", f"https://{authority}{target}", headers)
        signer = HTTPMessageSigner(signature_algorithm=algorithms.HMAC_SHA256,
                                   key_resolver=MappingKeyResolver(
                                       public_keys={}, private_keys={api_key: base64.b64decode(client_secret)}))
        signer.sign(request, key_id=api_key, label="sig1",
                    nonce=nonce or base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("="),
                    covered_component_ids=AUDIOHOOK_COVERED)
    return {k: v for k, v in headers.items() if k != "Host"}
