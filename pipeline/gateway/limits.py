"""Per-source and per-session limits at the gateway's door: sessions open at once and handshakes per
second for each source address, messages per second for each session.

What they stop: one address (a misbehaving integration, or anyone, before its credentials are even
checked) opening sockets or handshaking fast enough to starve every other caller, and one stream flooding
the event loop with messages that all other streams wait behind. The platforms' real traffic is far below
them: a Twilio stream of both tracks sends 100 messages a second, an AudioHook session 50, and both
platforms open many calls' streams from a few addresses, which is why the per-source figures are high.
A source over its limits has its session closed 1013 (try again later) right after the upgrade, before
any of its messages is read (the websocket server tells the peer address only then); a session over its
message rate is closed 1008. Each counted by what was exceeded. A handshake refused for its credentials
(403/401) never reaches these counts: that refusal is already cheap, one HMAC.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_TRACKED_SOURCES = 10_000  # beyond this, idle sources' buckets are forgotten (they are full anyway)


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved; ``take`` spends one if there is one."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:  # a new bucket starts full
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def full(self, now: float) -> bool:
        return self.tokens < 0 or self.tokens + (now - self.at) * self.rate >= self.burst


@dataclass
class SourceLimits:
    """Sessions open at once and handshakes per second, per source address (0: no limit)."""

    max_sessions: int
    handshakes_per_s: float
    clock: Callable[[], float] = time.monotonic
    open_sessions: dict[str, int] = field(default_factory=dict)
    _handshakes: dict[str, TokenBucket] = field(default_factory=dict)

    def refusal(self, source: str) -> str | None:
        """Why a handshake from ``source`` is refused now (``source_sessions``, ``source_handshake_rate``),
        or None. Called for every handshake, before its credentials are checked."""
        if self.max_sessions and self.open_sessions.get(source, 0) >= self.max_sessions:
            return "source_sessions"
        if self.handshakes_per_s > 0:
            now = self.clock()
            bucket = self._handshakes.get(source)
            if bucket is None:
                self._forget_idle(now)
                # A burst of four seconds' worth: a platform opens many calls' streams at once at a peak.
                bucket = self._handshakes[source] = TokenBucket(self.handshakes_per_s, 4 * self.handshakes_per_s)
            if not bucket.take(now):
                return "source_handshake_rate"
        return None

    def opened(self, source: str) -> None:
        self.open_sessions[source] = self.open_sessions.get(source, 0) + 1

    def closed(self, source: str) -> None:
        left = self.open_sessions.get(source, 0) - 1
        if left > 0:
            self.open_sessions[source] = left
        else:
            self.open_sessions.pop(source, None)

    def _forget_idle(self, now: float) -> None:
        if len(self._handshakes) >= MAX_TRACKED_SOURCES:
            self._handshakes = {s: b for s, b in self._handshakes.items() if not b.full(now)}


def message_bucket(messages_per_s: float) -> TokenBucket | None:
    """A session's message budget (two seconds' worth of burst), or None without a limit."""
    return TokenBucket(messages_per_s, 2 * messages_per_s) if messages_per_s > 0 else None


def source_of(peer: str, forwarded_for: str, trust_forwarded: bool) -> str:
    """The caller's address: the socket's peer, or behind a proxy that appends it, the last address of
    ``X-Forwarded-For`` (the one that proxy added; any before it the client may have written itself)."""
    if trust_forwarded and forwarded_for.strip():
        return forwarded_for.split(",")[-1].strip()[:64]
    return peer
