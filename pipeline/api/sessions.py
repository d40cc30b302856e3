"""The session cookie of the call pages' login: what a browser shows instead of the bearer token.

A browser cannot send a bearer token, so /login takes the token in a form and sets a cookie that holds
neither the token nor anything derived from it alone: ``<expires>.<nonce>.<mac>``, the MAC an
HMAC-SHA256 under a key derived from the token. Stateless: any worker with the same token accepts it, it
expires on its own, and changing the token ends every session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SESSION_COOKIE = "callqa_session"


def session_key(token_digest: bytes) -> bytes:
    """The cookie-signing key: from the token's digest, for this purpose only."""
    return hmac.new(token_digest, b"callqa web session v1", hashlib.sha256).digest()


def _mac(key: bytes, payload: str) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def new_session(key: bytes, now_s: float, ttl_s: float) -> str:
    """A cookie value valid until ``now_s + ttl_s``."""
    payload = f"{int(now_s + ttl_s)}.{secrets.token_urlsafe(16)}"
    return f"{payload}.{_mac(key, payload)}"


def session_valid(key: bytes, value: str | None, now_s: float) -> bool:
    """True for a value ``new_session`` made with ``key`` that has not expired."""
    if not value or value.count(".") != 2:
        return False
    expires, nonce, mac = value.split(".")
    # The MAC first, in constant time; only a value we signed has its expiry read.
    if not hmac.compare_digest(_mac(key, f"{expires}.{nonce}").encode(), mac.encode()):
        return False
    return expires.isdigit() and int(expires) > now_s
