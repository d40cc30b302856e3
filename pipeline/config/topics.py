"""Topic names, partition counts, retention and cleanup policy."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TopicSettings(BaseModel):
    topic_audio: str = Field("callqa.audio-frames", description="Audio frames of every call leg, keyed by call ID.")
    topic_call_events: str = Field("callqa.call-events", description="Call start/end events, keyed by call ID.")
    topic_transcripts: str = Field("callqa.transcripts", description="Final (and partial) transcript segments.")
    topic_latency: str = Field("callqa.latency", description="Per-segment latency metrics.")
    topic_qa: str = Field("callqa.qa", description="Call QA results and live QA alerts.")
    topic_dead_letters: str = Field("callqa.dead-letters", description="Messages that could not be processed.")
    topic_checkpoints: str = Field(
        "callqa.call-checkpoints",
        description="Compacted: the newest resume point of each open call, keyed by call ID, partitioned as the audio.",
    )
    audio_partitions: int = Field(12, description="Partitions of the audio frames topic.")
    events_partitions: int = Field(12, description="Partitions of the call events topic (same as audio so a call co-partitions).")
    output_partitions: int = Field(6, description="Partitions of the transcripts, latency and QA topics.")
    dead_letter_partitions: int = Field(1, description="Partitions of the dead-letter topic.")
    audio_retention_ms: int = Field(6 * 3600 * 1000, description="Retention of raw audio frames (ms); short, audio is bulky.")
    output_retention_ms: int = Field(7 * 24 * 3600 * 1000, description="Retention of transcripts, latency and QA topics (ms).")
    dead_letter_retention_ms: int = Field(30 * 24 * 3600 * 1000, description="Retention of the dead-letter topic (ms).")
    cleanup_policy: str = Field("delete", description="cleanup.policy of every callqa topic (delete or compact).")
    replication_factor: int = Field(1, description="Replication factor of created topics (1 on the single local broker).")
