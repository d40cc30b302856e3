"""Outputs of a call: released segments, failed segments and the call's QA go to Kafka and ClickHouse.

Messages go through the ``OutputPort`` (their deliveries are kept on the call: its offsets are released
only once they are acknowledged, see durability.py) and rows through the ``RowSink``. What the messages
and rows hold is built in outputs.py; this stage decides what a call publishes when.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from pipeline.config import Settings
from pipeline.contracts.messages import DeadLetter, Message, now_ms
from pipeline.qa.call import AnalyzedSegment
from pipeline.qa.scorecard import CallQaResult
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.store.base import RowSink
from pipeline.worker.dead_letters import segment_dead_letter
from pipeline.worker.legs import LegState
from pipeline.worker.live_summary import LiveSummaries
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.outputs import (
    call_qa_message,
    call_qa_row,
    call_row,
    latency_message,
    latency_row,
    post_call_job,
    qa_alert,
    qa_event_row,
    segment_row,
    transcript_message,
)
from pipeline.worker.ports import OutputPort
from pipeline.worker.state import CallState, DecodedSegment, publish

# The id under which a call's QA result (and its post-call job) counts as published (CallState.published).
QA_OUTPUT = "qa"


class CallOutputs:
    """Publishes a call's results and writes its rows."""

    def __init__(self, settings: Settings, output: OutputPort, sink: RowSink, metrics: WorkerMetrics,
                 live_output: OutputPort | None = None) -> None:
        self.settings = settings
        self.output = output
        self.sink = sink
        self.metrics = metrics
        # Held while one output's messages are published (a segment's transcript, latency and alerts; the
        # QA result and job), and by the commit while it records what is published and commits: a
        # transaction holds all of an output's messages or none, and the record that lists it.
        self.publishing = asyncio.Lock()
        # The call's summary for the live desk, and its end: with ``live_output`` (the worker: faust's own
        # producer) outside the partitions' transactions, which a best-effort view has no part in.
        self.live = LiveSummaries(settings, live_output or output)

    async def segment(self, call: CallState, decoded: DecodedSegment, analyzed: AnalyzedSegment) -> None:
        """A released final: its transcript, latency and QA alerts, and its rows."""
        leg, start_ms, end_ms, r, consumed_ms, closed_ms = decoded
        seg_id = analyzed.redacted.segment.segment_id
        text = analyzed.redacted.text  # the analyzer redacts unless redaction is explicitly off
        produced = now_ms()
        last_frame_ms = leg.produced_at(end_ms) or consumed_ms
        transcript = transcript_message(call.call_id, leg, seg_id, start_ms, end_ms, text, r, True,
                                        sum(analyzed.redacted.counts.values()), closed_ms, produced,
                                        sentiment=analyzed.sentiment)
        latency = latency_message(call.call_id, leg.leg, seg_id, r, consumed_ms, last_frame_ms, produced,
                                  self.settings.worker_id)
        async with self.publishing:
            if seg_id not in call.published:  # else a committed transaction holds it (a replay: see state.py)
                await self.publish(call, self.settings.topic_transcripts, transcript)
                await self.publish(call, self.settings.topic_latency, latency)
                for ev in analyzed.events:
                    self.metrics.qa_alerts.labels(ev.rule).inc()
                    await self.publish(call, self.settings.topic_qa, qa_alert(call.call_id, ev))
                self._published(call, seg_id)
        await self.sink.write("segments", [segment_row(transcript)])
        await self.sink.write("latency", [latency_row(latency)])
        call.segments_done += 1
        call.unresolved.discard(seg_id)  # only now: a checkpoint after it needs its rows written
        self.live.changed(call)
        self.metrics.segments.labels("final").inc()
        self.metrics.final_delay.observe(latency.end_to_end_ms / 1000)
        self.metrics.batch_size.observe(r.batch_size)

    async def segment_failed(self, call: CallState, leg: LegState, seg: SpeechSegment, seg_id: str,
                             exc: BaseException) -> None:
        """A segment that could not be transcribed goes to the dead-letter topic (the call goes on)."""
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        letter: DeadLetter = segment_dead_letter(
            self.settings.topic_audio, call.audio_tp[1] if call.audio_tp else -1, call.call_id, leg.leg, seg,
            seg_id, exc, self.settings.worker_id, self.settings.debug_raw_audio,
        )
        await self.publish(call, self.settings.topic_dead_letters, letter)

    async def call_result(self, call: CallState, result: CallQaResult, how: str, audio_ms: int,
                          audio_end_offset: int | None = None) -> None:
        """The call's QA (message, call row, QA rows), once all its segments are out; with recordings on or a
        post-call model set, the call's job too (one of its messages: durable before its input is released,
        so a finished call's recording and pass are never lost; a replay may write it twice, which is taken
        as one, its rows being keyed by call and revision)."""
        start = call.start or call.end
        ended_ms = now_ms()
        qa = call_qa_message(call.call_id, result, start, call.hold_intervals(audio_ms), call.pause_intervals(audio_ms))
        if not qa.tenant:  # its gateway or producer named none: the default tenant's accounts see it
            qa = replace(qa, tenant=self.settings.default_tenant)
        async with self.publishing:
            if QA_OUTPUT not in call.published:
                await self.publish(call, self.settings.topic_qa, qa)
                wanted = self.settings.post_call_model or self.settings.recordings
                if wanted and call.audio_tp is not None and audio_end_offset is not None:
                    job = post_call_job(call, qa, start, how, audio_ms, ended_ms, self.settings.post_call_model,
                                        audio_end_offset, self.settings.final_pass_read_margin_s)
                    await self.publish(call, self.settings.topic_postcall, job)
                    self.metrics.postcall_jobs.inc()
                self._published(call, QA_OUTPUT)
        await self.sink.write("calls", [call_row(call, qa, start, how, audio_ms, ended_ms, result.categories)])
        await self.sink.write("call_qa", [call_qa_row(qa)])
        if result.events:
            await self.sink.write("qa_events", [qa_event_row(call.call_id, e) for e in result.events])
        self.live.ended(call)
        self.metrics.calls_finished.labels(how).inc()
        self.metrics.holds.inc(result.metrics.get("holds", 0))
        self.metrics.hold_seconds.inc(result.metrics.get("hold_ms", 0) / 1000)

    @staticmethod
    def _published(call: CallState, output: str) -> None:
        call.published.add(output)
        call.unrecorded = True

    async def publish(self, call: CallState, topic: str, message: Message) -> None:
        """One of the call's messages, keyed by its id (its delivery is awaited before its release)."""
        await publish(self.output, call, topic, call.call_id, message)
