"""The session cookie of the call pages' login: what a browser shows instead of the bearer token.

A browser cannot send a bearer token, so /login takes the token in a form and sets a cookie that holds
neither the token nor anything derived from it alone: ``<expires>.<nonce>.<mac>``, the MAC an
HMAC-SHA256 under a key derived from the token. Any worker with the same token accepts it, it expires on
its own, and changing the token ends every session.

Logging out revokes the session, not only the browser's copy of the cookie (a copy taken earlier, from a
proxy log or a shared machine, would otherwise work until it expires): ``SessionRevocations`` keeps the
nonces logged out until they expire, and its ``RevocationSource`` keeps them in the store, where other
workers on the same store and a restarted worker read them (pipeline/api/revocations.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from typing import Protocol

SESSION_COOKIE = "callqa_session"

log = logging.getLogger("callqa.worker.api")


def session_key(token_digest: bytes) -> bytes:
    """The cookie-signing key: from the token's digest, for this purpose only."""
    return hmac.new(token_digest, b"callqa web session v1", hashlib.sha256).digest()


def form_key(token_digest: bytes) -> bytes:
    """The key of the pages' form (CSRF) tokens: from the token's digest, for this purpose only."""
    return hmac.new(token_digest, b"callqa web form v1", hashlib.sha256).digest()


def form_token(key: bytes, cookie: str) -> str:
    return _mac(key, f"form.{cookie}")


def _mac(key: bytes, payload: str) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def new_session(key: bytes, now_s: float, ttl_s: float, account_id: str = "") -> str:
    """A cookie value valid until ``now_s + ttl_s``; of the account ``account_id`` (an account's login: its id,
    never its name, which a later account may take), else the operator's."""
    payload = f"{int(now_s + ttl_s)}.{secrets.token_urlsafe(16)}"
    if account_id:
        payload += "." + base64.urlsafe_b64encode(account_id.encode()).decode().rstrip("=")
    return f"{payload}.{_mac(key, payload)}"


def session_account(value: str) -> str:
    """The id of the account a signed session value is of ("" for the operator's); only after ``signed_session``."""
    parts = value.split(".")
    if len(parts) != 4:
        return ""
    return base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)).decode(errors="replace")


def session_valid(key: bytes, value: str | None, now_s: float) -> bool:
    """True for a value ``new_session`` made with ``key`` that has not expired."""
    return signed_session(key, value, now_s) is not None


def signed_session(key: bytes, value: str | None, now_s: float) -> tuple[str, int] | None:
    """(nonce, expiry in unix seconds) of a value ``new_session`` made with ``key`` that has not expired."""
    # Ours are ASCII; a header's undecodable bytes arrive as surrogates, which no MAC can be taken of.
    if not value or not value.isascii() or value.count(".") not in (2, 3):
        return None
    payload, _, mac = value.rpartition(".")
    expires, nonce = payload.split(".")[:2]
    # The MAC first, in constant time; only a value we signed has its expiry read.
    if not hmac.compare_digest(_mac(key, payload).encode(), mac.encode()):
        return None
    if not expires.isdigit() or int(expires) <= now_s:
        return None
    return nonce, int(expires)


class RevocationSource(Protocol):
    """Where logged-out sessions are kept for every worker: nonce -> expiry (unix seconds)."""

    async def load(self) -> dict[str, int]: ...

    async def save(self, nonce: str, expires_s: int) -> None: ...


class SessionRevocations:
    """The sessions logged out before their expiry, refused though their MAC is good.

    Held in memory and kept in a ``RevocationSource`` when one is attached: a logout saves its nonce
    there, and the set is read again at most every ``sync_s`` seconds when a page is asked for, so a
    session logged out on one worker is refused by the others on the same store within ``sync_s``.
    """

    def __init__(self, sync_s: float = 5.0) -> None:
        self.sync_s = sync_s
        self.source: RevocationSource | None = None
        self._expiry: dict[str, int] = {}  # nonce -> expiry (unix seconds)
        self._synced_at: float | None = None  # monotonic

    def is_revoked(self, nonce: str) -> bool:
        return nonce in self._expiry

    async def revoke(self, nonce: str, expires_s: int, now_s: float) -> None:
        """Refuse the session from now on, here at once and, once saved, on every worker of the store."""
        self._expiry[nonce] = expires_s
        self._prune(now_s)
        if self.source is not None:
            await self.source.save(nonce, expires_s)

    async def sync(self, now_s: float, monotonic_s: float) -> None:
        """Read the source again when the last read is older than ``sync_s``. A failed read keeps what is
        known (a page then fails on the same store anyway) and is tried again after ``sync_s``."""
        if self.source is None or (self._synced_at is not None and monotonic_s - self._synced_at < self.sync_s):
            return
        self._synced_at = monotonic_s
        try:
            self._expiry.update(await self.source.load())
        except Exception as exc:  # noqa: BLE001 - the store's errors are many; the pages report them
            log.warning("could not read the logged-out sessions: %s", str(exc).splitlines()[0] if str(exc) else exc)
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        self._expiry = {nonce: expires for nonce, expires in self._expiry.items() if expires > now_s}
