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
    # A message per 20 ms frame had the worker's event loop take 50 messages a second per leg (faust,
    # decoding, checks and the jitter buffer per message). A longer message costs the producer up to its
    # length in latency: its first sample waits for its last. bench live, 10 calls on 2 pinned cores, one run
    # (bench/results/message-span): event loop CPU s per speech s 0.0372 / 0.0236 / 0.0184 at 20 / 100 / 200 ms,
    # the worker's 0.1092 / 0.0974 / 0.0914; endpoint P50 0.505 / 0.540 / 0.586 s; P99 final 2.06 / 1.65 / 1.78 s.
    audio_message_ms: int = Field(
        200, ge=20, le=1000, multiple_of=20,
        description="Audio a producer packs into one audio message (ms, a multiple of 20): callqa gateway, "
        "callqa replay and the benchmarks' traffic. Longer messages cost the worker less per second of audio "
        "and delay each one's first sample by up to this much.",
    )
    audio_partitions: int = Field(12, description="Partitions of the audio frames topic.")
    events_partitions: int = Field(12, description="Partitions of the call events topic: the audio's count, so a call "
                                   "co-partitions (the worker refuses to start otherwise).")
    output_partitions: int = Field(6, description="Partitions of the transcripts, latency and QA topics.")
    dead_letter_partitions: int = Field(1, description="Partitions of the dead-letter topic.")
    audio_retention_ms: int = Field(6 * 3600 * 1000, description="Retention of raw audio frames (ms); short, audio is bulky.")
    output_retention_ms: int = Field(7 * 24 * 3600 * 1000, description="Retention of transcripts, latency and QA topics (ms).")
    dead_letter_retention_ms: int = Field(30 * 24 * 3600 * 1000, description="Retention of the dead-letter topic (ms).")
    cleanup_policy: str = Field("delete", description="cleanup.policy of every callqa topic (delete or compact).")
    replication_factor: int = Field(1, description="Replication factor of created topics (1 on the single local broker).")
