"""Pages of /api/calls: at most ``api_page_max`` calls per answer, and a cursor to the next page.

Keyset paging on the list's own order (newest first: ``started_at`` descending, then ``call_id``): the
cursor names the last call of a page, and the next page starts after it, so a page costs the same at
any depth and calls arriving meanwhile shift nothing. The cursor is opaque to clients (base64url of
``<started_at ms>:<call_id>``) and is given in the answer's ``Link: <...>; rel="next"`` header (RFC 8288),
which keeps the body the list it always was.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol


class PageError(ValueError):
    """A ``limit`` or ``after`` a client sent that cannot be used (answered 400, naming it)."""


@dataclass(frozen=True)
class CallPage:
    """Which calls one request asks for: at most ``limit``, after the call the cursor names."""

    limit: int
    after: tuple[datetime, str] | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str], default: int, maximum: int) -> CallPage:
        raw = query.get("limit", "")
        if raw and not raw.isdigit():
            raise PageError(f"limit must be a whole number from 1 to {maximum}, not {raw[:20]!r}")
        limit = int(raw) if raw else default
        if not 1 <= limit <= maximum:
            raise PageError(f"limit must be from 1 to {maximum} (CALLQA_API_PAGE_MAX), not {limit}")
        cursor = query.get("after")
        return cls(limit, decode_cursor(cursor) if cursor else None)


def encode_cursor(started_at: datetime, call_id: str) -> str:
    """The cursor naming a call of the list (its place in the list's order); the API and the pages share it."""
    ms = round(started_at.timestamp() * 1000)
    return base64.urlsafe_b64encode(f"{ms}:{call_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ms, call_id = text.split(":", 1)
        return datetime.fromtimestamp(int(ms) / 1000, UTC), call_id
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError, OSError):
        raise PageError("after is not a cursor this API gave (take it from the Link header's rel=\"next\")") from None


class Listed(Protocol):
    """A call in a list's order: a summary of the call list, a call a search found."""

    @property
    def started_at(self) -> datetime: ...

    @property
    def call_id(self) -> str: ...


def next_link(path: str, query: Mapping[str, str], page: CallPage, calls: Sequence[Listed]) -> str | None:
    """The ``Link`` header to the page after ``calls``; None when this one was the last (not full)."""
    if len(calls) < page.limit:
        return None
    params = {**{k: v for k, v in query.items() if k not in ("after", "limit")},
              "limit": str(page.limit), "after": encode_cursor(calls[-1].started_at, calls[-1].call_id)}
    return f'<{path}?{urllib.parse.urlencode(params)}>; rel="next"'
