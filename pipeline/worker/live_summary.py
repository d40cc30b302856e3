"""The live summary of each call in progress (``LiveCall`` on ``topic_live_calls``, compacted): what the live
desk's wall shows of a call, whichever worker holds it.

A summary is computed from the call's state, not counted up as outputs go: its talk, sentiment and alerts come
from the call's analyzer, which a call resumed from a checkpoint gets back whole, so a take-over's first
summary is as complete as its predecessor's last. A call's first summary (its start) goes at once, later ones
at most every ``live_summary_interval_s`` (a change inside the interval waits for the worker's next tick),
and its end is a tombstone, which removes the call from the compacted topic.
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.config import Settings
from pipeline.contracts.messages import LiveCall, now_ms
from pipeline.qa.metrics import merge_intervals, total_ms
from pipeline.qa.sentiment import trend_of
from pipeline.worker.ports import OutputPort
from pipeline.worker.state import CallState

log = logging.getLogger("callqa.worker")

# The wall's small trend line: the customer's last turns.
TREND_TURNS = 12


def live_summary(call: CallState, default_tenant: str, at_ms: int) -> LiveCall | None:
    """The call as the wall shows it now; None before its start event (its tenant, which scopes who may see
    it, is not known yet)."""
    start = call.start
    if start is None or call.analyzer is None:
        return None
    call_ms = max((leg.audio_ms for leg in call.legs.values()), default=0)
    segments = call.analyzer.segments
    talk = {leg: sum(s.end_ms - s.start_ms for s in segments if s.leg == leg) for leg in ("agent", "customer")}
    # Silence: call time neither leg spoke in, holds and secure pauses left out, as the call's QA counts it.
    covered = [(s.start_ms, s.end_ms) for s in segments]
    covered += [*call.hold_intervals(call_ms), *call.pause_intervals(call_ms)]
    silence = max(0, call_ms - total_ms(merge_intervals([(a, min(b, call_ms)) for a, b in covered if a < call_ms])))
    customer = call.analyzer.sentiment().leg("customer")
    scores = [call.analyzer.sentiments.get(s.segment_id, 0.0)
              for s in sorted(segments, key=lambda s: s.start_ms) if s.leg == "customer"]
    alerts = call.analyzer.alerts
    last = alerts[-1] if alerts else None
    return LiveCall(
        call_id=call.call_id, started_at_ms=start.at_ms, updated_at_ms=at_ms,
        tenant=start.tenant or default_tenant, agent_id=start.agent_id, queue=start.queue, direction=start.direction,
        call_ms=call_ms, agent_talk_ms=talk["agent"], customer_talk_ms=talk["customer"], silence_ms=silence,
        turns=len(segments), customer_sentiment=customer.end, customer_trend=trend_of(customer.change),
        customer_scores=[round(s, 2) for s in scores[-TREND_TURNS:]], alerts=len(alerts),
        last_alert_rule=last.rule if last else "", last_alert_severity=last.severity if last else "",
        last_alert_ms=last.offset_ms if last else -1,
        on_hold=call.held_from_ms is not None or call.paused_from_ms is not None,
    )


class LiveSummaries:
    """Sends each call's live summary when it changed and its interval has passed, and its tombstone.

    Best effort, beside the call's own outputs: a summary is sent on a task of its own and nothing of the
    call waits for it or fails with it (a partition moving away, a broker restart). A lost summary is
    replaced by the call's next one, and the desk takes a lost tombstone's call away with the call's QA
    published all the same; failures are counted and logged, not raised."""

    def __init__(self, settings: Settings, output: OutputPort) -> None:
        self.topic = settings.topic_live_calls
        self.interval_ms = settings.live_summary_interval_s * 1000
        self.default_tenant = settings.default_tenant
        self.output = output
        self.failures = 0
        self._sent_ms: dict[str, int] = {}  # call id -> when its last summary went
        self._due: set[str] = set()  # calls changed since their last summary
        self._sending: set[asyncio.Task[None]] = set()

    def changed(self, call: CallState) -> None:
        """The call moved on (started, a final, a hold): its summary now, or at a tick once its interval passed."""
        if call.finishing:
            return  # its tombstone follows
        self._due.add(call.call_id)
        if now_ms() - self._sent_ms.get(call.call_id, 0) >= self.interval_ms:
            self._send(call)

    def send_due(self, calls: dict[str, CallState]) -> None:
        """The tick: each call with a change held back by its interval, once the interval has passed."""
        wall = now_ms()
        for call_id in [c for c in self._sent_ms if c not in calls]:
            del self._sent_ms[call_id]  # gone without an end here: its partition moved
        for call_id in list(self._due):
            call = calls.get(call_id)
            if call is None or call.finishing:
                self._due.discard(call_id)
            elif wall - self._sent_ms.get(call_id, 0) >= self.interval_ms:
                self._send(call)

    def ended(self, call: CallState) -> None:
        """The call is over: its tombstone (a reader removes it; compaction drops its summaries)."""
        self._due.discard(call.call_id)
        self._sent_ms.pop(call.call_id, None)
        self._publish(call, None)

    async def settled(self) -> None:
        """Until what was handed over so far is sent (or failed)."""
        while self._sending:
            await asyncio.gather(*list(self._sending))

    def _send(self, call: CallState) -> None:
        self._due.discard(call.call_id)
        try:
            summary = live_summary(call, self.default_tenant, now_ms())
        except Exception as exc:  # noqa: BLE001 - the live view's figures must never fail a call
            self._failed(call.call_id, exc)
            return
        if summary is not None:
            self._sent_ms[call.call_id] = summary.updated_at_ms
            self._publish(call, summary)

    def _publish(self, call: CallState, message: LiveCall | None) -> None:
        partition = call.audio_tp[1] if call.audio_tp is not None else -1
        task = asyncio.create_task(self._deliver(call.call_id, partition, message))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, call_id: str, partition: int, message: LiveCall | None) -> None:
        try:
            delivered = await self.output.publish(self.topic, call_id, message, partition)
            await delivered
        except Exception as exc:  # noqa: BLE001 - see the class: counted and logged, never raised
            self._failed(call_id, exc)

    def _failed(self, call_id: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            log.warning("live summary of call %s not published (%s); %d so far", call_id, type(exc).__name__,
                        self.failures)
