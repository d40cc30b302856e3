"""Settings of the post-call pass: a finished call transcribed again by the accurate model.

The model is ``final_model`` (config/asr.py, ``CALLQA_FINAL_MODEL``; empty: no pass). When it is set, the
worker that finishes a call writes a job to ``topic_postcall``, and every worker runs the pass over the
jobs of its consumer group (``<worker_id>.postcall``) beside its live work, at low priority.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class PostCallSettings(BaseModel):
    topic_postcall: str = Field(
        "callqa.postcall-jobs",
        description="Finished calls for the post-call pass, keyed by call ID (the audio topic's partition count).",
    )
    postcall_retention_ms: int = Field(
        6 * 3600 * 1000,
        description="Retention of post-call jobs (ms): a job is no use once the call's audio has expired.",
    )
    # The pass's batches run on an inference thread of their own at this nice value, so the OS gives the
    # live inference thread and the event loop the cores first. CALLQA_FINAL_PASS_NICE, default 19.
    final_pass_nice: int = Field(19, ge=0, le=19, description="OS nice value of the post-call pass's inference thread.")
    # Live first: the pass sends its next batch only while the live batcher has at most this many segments
    # queued, and a batch is at most final_pass_max_batch segments, which bounds how long one pass batch
    # can hold a core a live batch wants. CALLQA_FINAL_PASS_LIVE_QUEUE_MAX, default 0.
    final_pass_live_queue_max: int = Field(
        0, ge=0, description="The pass waits while the live batcher has more segments than this queued.",
    )
    final_pass_max_batch: int = Field(
        8, ge=1, description="Most segments in one batch of the post-call pass (bounds how long it holds a core).",
    )
    # Frames carry the producer's clock; Kafka's message timestamps are the producer's too, but a call's
    # first frames may have been produced a little before its first frame the worker saw was stamped.
    final_pass_read_margin_s: float = Field(
        30.0, ge=0, description="The call's audio is read back from this long before its first frame (s).",
    )
