"""Settings of the live desk: the per-call live summary the workers publish, and the desk that follows it.

Workers publish each call in progress to ``topic_live_calls`` (compacted, keyed by call id) at most every
``live_summary_interval_s``, and a tombstone when it ends. The desk (``/live``, ``/api/live/*``, served by
``callqa desk`` and by each worker's web port) follows that topic with the transcripts and QA topics:
nothing on it waits on a worker, and no worker waits on it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LiveSettings(BaseModel):
    topic_live_calls: str = Field(
        "callqa.live-calls",
        description="Compacted: the newest live summary of each call in progress, keyed by call ID; a tombstone "
        "when it ends.",
    )
    # A summary per final would be one message per turn; the wall needs a few a second at most. The first
    # one of a call (its start) and the tombstone go at once; the rest wait out the interval, and the
    # worker's 1 s tick sends one that is due.
    live_summary_interval_s: float = Field(
        0.5, ge=0, description="Least time between two live summaries of one call (s); 0 sends one per change.",
    )
    # How far back a desk that starts reads the transcripts and alerts of the calls in progress: a call
    # longer than this shows only its last part until its next turns.
    live_lookback_s: float = Field(
        4 * 3600.0, gt=0, description="Longest stretch of a call in progress a starting desk reads back (s).",
    )
    # A worker follows the topics only while someone looks: it starts on the first live request and
    # stops once nobody has asked for this long, so a worker nobody watches pays nothing for the desk.
    live_idle_stop_s: float = Field(
        300.0, gt=0, description="A worker's desk stops following the topics after this long without a live "
        "request or stream (s); `callqa desk` follows them always.",
    )
    live_event_buffer: int = Field(
        20000, ge=100, description="Events a desk keeps for streams that reconnect (Last-Event-ID); one further "
        "back gets the snapshot again.",
    )
    # A stream sends a comment this often when nothing happens, so proxies keep it open and a dead client is
    # found; it ends after live_stream_max_s and the browser reconnects with Last-Event-ID (no gap).
    live_heartbeat_s: float = Field(15.0, gt=0, description="Idle time after which a live stream sends a keep-alive (s).")
    live_stream_max_s: float = Field(
        600.0, gt=0, description="Longest one live event stream stays open before the client reconnects (s).",
    )
    live_max_streams: int = Field(
        200, ge=1, description="Live event streams one process serves at once; past it a new one is answered 503.",
    )
    live_source_max_streams: int = Field(
        20, ge=1, description="Live event streams one source (peer address) may hold open at once; past it 429.",
    )
    live_ended_keep_s: float = Field(
        900.0, ge=0, description="How long a desk still answers for a call that ended (its page links to the "
        "finished call) before the call id is unknown to it (s).",
    )
