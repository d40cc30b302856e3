"""The live desk's state: the calls in progress, each call's turns and alerts so far, and the numbered events a
browser's stream replays from (``Last-Event-ID``). Pure: fed decoded messages on the event loop by the
follower (follower.py), read by the views; no Kafka, no clock of its own (times come with the calls).

What the topics give, in whatever order their partitions arrive:
- a call's live summary (``LiveCall``, compacted topic): it is in progress, with who and where (the scope a
  viewer needs); a tombstone: it ended. A summary of a call that ended is ignored: it can only be a stale copy
  from a worker that lost the call, which would otherwise put it back on the wall for good.
- transcripts: a partial is shown as provisional and replaced by its segment's final; a final is never
  replaced by a partial; only the live pass's (revision 0). A replay after a take-over publishes the same
  segment ids again (the worker's ids are derived from call, leg and start): taken as one.
- alerts: taken once per (rule, leg, call time), whatever the replays.
A turn or alert of a call whose summary has not come yet waits (bounded) for it: the topics are separate.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

from pipeline.access.users import Principal
from pipeline.contracts.messages import LiveCall, QaAlert, TranscriptSegment

# Held for calls whose summary has not come yet: at most this many calls, this many items each.
PENDING_CALLS = 500
PENDING_PER_CALL = 200
# A call's turns kept on the desk (a very long call shows its latest).
TURNS_PER_CALL = 2000
# The newest ended calls whose turns and alerts stay known, for a final or alert read after the call's tombstone:
# the tombstone goes out on another producer and topic than the call's last final, and may be read first.
LATE_CALLS = 200


@dataclass(frozen=True)
class LiveTurn:
    segment_id: str
    leg: str
    start_ms: int
    end_ms: int
    text: str
    final: bool
    sentiment: float


@dataclass(frozen=True)
class LiveAlert:
    rule: str
    category: str
    leg: str
    severity: str
    offset_ms: int
    text: str
    detected_at_ms: int


@dataclass
class BoardCall:
    summary: LiveCall
    turns: dict[str, LiveTurn] = field(default_factory=dict)  # by segment id, in arrival order
    alerts: dict[tuple[str, str, int], LiveAlert] = field(default_factory=dict)

    def visible_to(self, who: Principal) -> bool:
        return visible(self.summary.tenant, self.summary.agent_id, who)


@dataclass(frozen=True)
class LiveEvent:
    """One change on the desk, as a stream sends it: ``kind`` is ``call`` (a summary, new or updated),
    ``turn``, ``alert`` or ``ended``; ``data`` is its JSON body."""

    seq: int
    kind: str
    call_id: str
    tenant: str
    agent_id: str
    data: dict[str, Any]


@dataclass
class EndedCall:
    tenant: str
    agent_id: str
    ended_at_ms: int
    # The call as it was at its end, kept a while (LATE_CALLS) for what comes after its tombstone.
    last: BoardCall | None = None


def visible(tenant: str, agent_id: str, who: Principal) -> bool:
    """The access scope (pipeline/access): the operator sees every tenant; an account its tenant; an agent only
    its own calls."""
    if who.is_operator:
        return True
    return tenant == who.tenant and (who.role != "agent" or agent_id == who.agent_id)


def summary_json(summary: LiveCall) -> dict[str, Any]:
    return asdict(summary)


def turn_json(call_id: str, turn: LiveTurn) -> dict[str, Any]:
    return {"call_id": call_id, **asdict(turn)}


def alert_json(call_id: str, alert: LiveAlert) -> dict[str, Any]:
    return {"call_id": call_id, **asdict(alert)}


class LiveBoard:
    """Calls in progress and the events that changed them (the newest ``buffer`` kept for resuming streams)."""

    def __init__(self, buffer: int = 20000, ended_keep_ms: int = 900_000) -> None:
        self.epoch = secrets.token_hex(4)  # a stream's event ids name it: ids of another desk or run do not resume
        self.calls: dict[str, BoardCall] = {}
        self.ended: OrderedDict[str, EndedCall] = OrderedDict()
        self.events: deque[LiveEvent] = deque(maxlen=buffer)
        self.seq = 0
        self.ended_keep_ms = ended_keep_ms
        self.ready = False  # the follower has read what was there when it started
        self.closed = False
        self._pending: OrderedDict[str, list[TranscriptSegment | QaAlert]] = OrderedDict()
        self._changed = asyncio.Event()

    # --- fed by the follower -------------------------------------------------------------------------------

    def apply(self, messages: Iterable[tuple[str, LiveCall | TranscriptSegment | QaAlert | None]]) -> None:
        """A batch of decoded messages: (call id, message), None for a summary's tombstone; waiters woken once."""
        before = self.seq
        for call_id, message in messages:
            if message is None:
                self._end(call_id)
            elif isinstance(message, LiveCall):
                self._summary(message)
            elif isinstance(message, TranscriptSegment):
                self._turn(message)
            else:
                self._alert(message)
        if self.seq != before:
            self._wake()

    def mark_ready(self) -> None:
        self.ready = True
        self._wake()

    def close(self) -> None:
        """The desk stops: every stream ends (its browser reconnects elsewhere, or later)."""
        self.closed = True
        self._wake()

    def _summary(self, summary: LiveCall) -> None:
        if summary.call_id in self.ended:
            return
        call = self.calls.get(summary.call_id)
        if call is None:
            call = self.calls[summary.call_id] = BoardCall(summary)
        elif summary.updated_at_ms < call.summary.updated_at_ms:
            return  # an older copy (a replay after a take-over)
        call.summary = summary
        self._emit("call", summary, summary_json(summary))
        for waiting in self._pending.pop(summary.call_id, []):
            self._turn(waiting) if isinstance(waiting, TranscriptSegment) else self._alert(waiting)

    def _end(self, call_id: str) -> None:
        call = self.calls.pop(call_id, None)
        self._pending.pop(call_id, None)
        if call is None:
            return
        ended_at = call.summary.updated_at_ms  # the desk has no clock of its own: the worker's last word
        self.ended[call_id] = EndedCall(call.summary.tenant, call.summary.agent_id, ended_at, call)
        self._emit("ended", call.summary, {"call_id": call_id, "page": f"/calls/{call_id}"})
        self._forget_ended(ended_at)
        if len(self.ended) > LATE_CALLS:
            next(islice(reversed(self.ended.values()), LATE_CALLS, None)).last = None

    def _turn(self, segment: TranscriptSegment) -> None:
        if segment.revision != 0:
            return  # a post-call pass: the finished call's page shows it
        call = self._call_or_wait(segment.call_id, segment)
        if call is None:
            return
        if segment.call_id not in self.calls and not segment.is_final:
            return  # a partial read after its call ended: its final says more
        known = call.turns.get(segment.segment_id)
        if known is not None and (known.final and not segment.is_final or (
                known.final == segment.is_final and known.text == segment.text)):
            return  # a partial after its final, or the same again (a replay)
        turn = LiveTurn(segment.segment_id, str(segment.leg), segment.start_ms, segment.end_ms, segment.text,
                        segment.is_final, round(segment.sentiment, 2))
        call.turns[segment.segment_id] = turn
        while len(call.turns) > TURNS_PER_CALL:
            del call.turns[next(iter(call.turns))]
        self._emit("turn", call.summary, turn_json(segment.call_id, turn))

    def _alert(self, alert: QaAlert) -> None:
        call = self._call_or_wait(alert.call_id, alert)
        if call is None:
            return
        key = (alert.rule, alert.leg, alert.offset_ms)
        if key in call.alerts:
            return
        item = call.alerts[key] = LiveAlert(alert.rule, alert.category, alert.leg, alert.severity, alert.offset_ms,
                                            alert.text, alert.detected_at_ms)
        self._emit("alert", call.summary, alert_json(alert.call_id, item))

    def _call_or_wait(self, call_id: str, message: TranscriptSegment | QaAlert) -> BoardCall | None:
        """The call a turn or alert belongs to: in progress, or ended lately (what was read after its
        tombstone is still shown, once); None when it waits for the call's summary or the call is long gone."""
        call = self.calls.get(call_id)
        if call is not None:
            return call
        ended = self.ended.get(call_id)
        if ended is not None:
            return ended.last
        waiting = self._pending.setdefault(call_id, [])
        self._pending.move_to_end(call_id)
        if len(waiting) < PENDING_PER_CALL:
            waiting.append(message)
        while len(self._pending) > PENDING_CALLS:
            self._pending.popitem(last=False)  # the oldest: a call that ended before the desk started
        return None

    def _forget_ended(self, now_ms: int) -> None:
        while self.ended:
            call_id, ended = next(iter(self.ended.items()))
            if now_ms - ended.ended_at_ms <= self.ended_keep_ms and len(self.ended) <= 100_000:
                break
            del self.ended[call_id]

    def _emit(self, kind: str, summary: LiveCall, data: dict[str, Any]) -> None:
        self.seq += 1
        self.events.append(LiveEvent(self.seq, kind, summary.call_id, summary.tenant, summary.agent_id, data))

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- read by the views ---------------------------------------------------------------------------------

    def snapshot(self, who: Principal) -> list[dict[str, Any]]:
        """The calls in progress ``who`` may see, longest first."""
        calls = [summary_json(c.summary) for c in self.calls.values() if c.visible_to(who)]
        return sorted(calls, key=lambda c: (c["started_at_ms"], c["call_id"]))

    def call(self, call_id: str, who: Principal) -> dict[str, Any] | None:
        """A call in progress with its turns (time order) and alerts; ``{"ended": ...}`` for one that ended
        lately; None for one unknown here or outside ``who``'s scope (a 404: the same answer for both)."""
        call = self.calls.get(call_id)
        if call is not None and call.visible_to(who):
            turns = sorted(call.turns.values(), key=lambda t: (t.start_ms, t.leg))
            return {"summary": summary_json(call.summary), "turns": [turn_json(call_id, t) for t in turns],
                    "alerts": [alert_json(call_id, a) for a in sorted(call.alerts.values(),
                                                                      key=lambda a: a.offset_ms)],
                    "ended": False, "last_event_id": self.event_id(self.seq)}
        ended = self.ended.get(call_id)
        if ended is not None and visible(ended.tenant, ended.agent_id, who):
            return {"ended": True, "page": f"/calls/{call_id}", "last_event_id": self.event_id(self.seq)}
        return None

    def event_id(self, seq: int) -> str:
        return f"{self.epoch}.{seq}"

    def events_after(self, last_event_id: str | None, who: Principal, call_id: str | None = None,
                     ) -> list[LiveEvent] | None:
        """The events after ``last_event_id`` that ``who`` may see (of ``call_id`` only, when given); None when
        they cannot be told (an id of another desk or run, or older than the buffer): the stream sends the
        snapshot again instead."""
        if last_event_id is None:
            return None
        epoch, _, number = last_event_id.partition(".")
        if epoch != self.epoch or not number.isascii() or not number.isdigit() or len(number) > 18:
            return None
        after = int(number)
        if after > self.seq:
            return None
        oldest = self.events[0].seq if self.events else self.seq + 1
        if after < oldest - 1:
            return None  # some were dropped from the buffer since
        start = len(self.events) - (self.seq - after)
        return [e for e in list(self.events)[start:] if (call_id is None or e.call_id == call_id)
                and visible(e.tenant, e.agent_id, who)]

    async def wait(self, after_seq: int, timeout_s: float) -> None:
        """Until an event after ``after_seq`` (or the desk closes), at most ``timeout_s``."""
        if self.seq > after_seq or self.closed:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
