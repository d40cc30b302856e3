"""The local API token file, for a worker on loopback with no CALLQA_API_TOKEN and the local commands.

A worker bound to loopback with no CALLQA_API_TOKEN makes a random token at its first start and keeps it
in ``<state_dir>/api-token`` (mode 0600, created exclusively, so two workers starting at once agree on
one); later starts reuse it, and local commands (`callqa report`) read it when no token is configured. A
file that others may read is refused, as ssh refuses a loose key: the token may have leaked.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

TOKEN_FILE_NAME = "api-token"
MIN_TOKEN_CHARS = 16


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
