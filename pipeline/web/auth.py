"""The local API token file and the session cookie of the call pages.

**Token file.** A worker bound to loopback with no CALLQA_API_TOKEN makes a random token at its first
start and keeps it in ``<state_dir>/api-token`` (mode 0600, created exclusively, so two workers starting
at once agree on one); later starts reuse it, and local commands (`callqa report`) read it when no
token is configured. A file that others may read is refused, as ssh refuses a loose key: the token may
have leaked.

**Session cookie.** A browser cannot send a bearer token, so /login takes the token in a form and sets a
cookie that holds neither the token nor anything derived from it alone: ``<expires>.<nonce>.<mac>``,
the MAC an HMAC-SHA256 under a key derived from the token. Stateless: any worker with the same token
accepts it, it expires on its own, and changing the token ends every session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

TOKEN_FILE_NAME = "api-token"
MIN_TOKEN_CHARS = 16
SESSION_COOKIE = "callqa_session"


def is_page_path(path: str) -> bool:
    """The call pages' paths, which need a login."""
    return path == "/calls" or path.startswith("/calls/")


class TokenFileError(RuntimeError):
    """The token file exists but may not be used (readable by others, too short)."""


def token_path(state_dir: Path) -> Path:
    return state_dir / TOKEN_FILE_NAME


def read_token_file(path: Path) -> str | None:
    """The token kept in ``path``; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenFileError(f"{path} is open to other users (mode {stat.S_IMODE(mode):04o}): the token may "
                                 f"have leaked; delete the file (a worker makes a new one) or chmod 600 it")
        token = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"{path} holds {len(token)} characters, fewer than {MIN_TOKEN_CHARS}: delete it "
                             "(a worker makes a new one)")
    return token


def ensure_token_file(path: Path) -> str:
    """The token in ``path``, made (random, mode 0600) if there is none yet."""
    existing = read_token_file(path)
    if existing is not None:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:  # another worker made it a moment ago: use that one
        found = read_token_file(path)
        assert found is not None
        return found
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


# --- session cookies -------------------------------------------------------------------------------


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
