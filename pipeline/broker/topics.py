"""The callqa topics, created idempotently with explicit partitions, retention and cleanup policy."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.broker.security import ClientErrors, KafkaUnavailableError, admin_client, cluster_metadata
from pipeline.config import Settings

# A compacted topic's head (its open segment) is never cleaned: a take-over reads all of it. The checkpoint
# topic gets a record per open call every commit interval (tens of KB), so 10-minute segments meant 50-100 MB
# read per take-over in the soak at 3 calls, growing with the calls. A minute, or 16 MB, bounds it.
COMPACTED_SEGMENT_MS = 60_000
COMPACTED_SEGMENT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    retention_ms: int
    purpose: str
    cleanup_policy: str = ""  # empty: the configured policy (settings.cleanup_policy)

    def config(self, settings: Settings) -> dict[str, str]:
        policy = self.cleanup_policy or settings.cleanup_policy
        config = {
            "retention.ms": str(self.retention_ms),
            "cleanup.policy": policy,
            # Frames are small and many; LZ4 keeps the broker's disk and network use down.
            "compression.type": "producer",
        }
        if policy == "compact":
            # Kafka compacts only closed segments, and by default a segment closes at 1 GB or after 7 days:
            # the checkpoint topic's records (25 KB per leg, every commit interval per open call) piled up
            # uncompacted, and each rebalance read them all. A segment closes after a minute or 16 MB, and a
            # tenth of superseded records is enough to clean.
            config.update({"segment.ms": str(COMPACTED_SEGMENT_MS), "segment.bytes": str(COMPACTED_SEGMENT_BYTES),
                           "min.cleanable.dirty.ratio": "0.1"})
        return config


def topic_specs(s: Settings) -> list[TopicSpec]:
    return [
        TopicSpec(s.topic_audio, s.audio_partitions, s.audio_retention_ms, "audio frames, keyed by call ID"),
        TopicSpec(s.topic_call_events, s.events_partitions, s.output_retention_ms, "call start/end events"),
        TopicSpec(s.topic_transcripts, s.output_partitions, s.output_retention_ms, "transcript segments"),
        TopicSpec(s.topic_latency, s.output_partitions, s.output_retention_ms, "per-segment latency"),
        TopicSpec(s.topic_qa, s.output_partitions, s.output_retention_ms, "call QA results and alerts"),
        TopicSpec(s.topic_dead_letters, s.dead_letter_partitions, s.dead_letter_retention_ms, "dead letters"),
        # One record per open call, replaced as the call moves on: compaction keeps the newest. Same
        # partition count as the audio, so a worker reads just the checkpoints of the partitions it owns.
        TopicSpec(s.topic_checkpoints, s.audio_partitions, -1, "call checkpoints (resume points)", "compact"),
        TopicSpec(s.topic_postcall, s.audio_partitions, s.postcall_retention_ms, "finished calls for the post-call pass"),
        # The newest summary of each call in progress and a tombstone when it ends: a desk that starts reads
        # just the calls in progress from it (pipeline/live/).
        TopicSpec(s.topic_live_calls, s.output_partitions, -1, "calls in progress (the live desk)", "compact"),
    ]


def ensure_topics(settings: Settings, specs: list[TopicSpec] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; return the names created (empty when all existed).

    Also the first contact of most commands with Kafka: a refused login or TLS handshake raises
    KafkaSecurityError at once, no answer at all KafkaUnavailableError.
    """
    specs = specs if specs is not None else topic_specs(settings)
    errors = ClientErrors(settings)
    admin = admin_client(settings, errors)
    existing = set(cluster_metadata(admin, errors, timeout_s).topics)
    missing = [t for t in specs if t.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(t.name, num_partitions=t.partitions, replication_factor=settings.replication_factor,
                     config=t.config(settings))
            for t in missing
        ],
        operation_timeout=timeout_s,
    )
    created = []
    for name, fut in futures.items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            # Another process created it between our listing and our request: that is fine.
            if exc.args and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
                continue
            raise
    _wait_for_leaders(admin, errors, missing, timeout_s)
    return created


def drop_topics(admin: AdminClient, prefix: str, timeout_s: float = 15.0) -> list[str]:
    """Delete every topic of a run named ``prefix``: its own (``<prefix>.*``) and those faust made for a
    consumer group of that name (``<prefix>-*``). Returns the names asked for; a failure raises
    KafkaException (callers that tidy up suppress it: a leftover topic costs the broker memory, not
    correctness)."""
    names = [t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith((f"{prefix}.", f"{prefix}-"))]
    if names:
        for future in admin.delete_topics(names, operation_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    return names


def _wait_for_leaders(admin: AdminClient, errors: ClientErrors, specs: list[TopicSpec], timeout_s: float) -> None:
    """Return once every partition of ``specs`` has a leader in the brokers' metadata. KRaft answers
    CreateTopics when the controller has committed the topic, before the brokers have published it: a
    produce in that window fails with UNKNOWN_TOPIC_OR_PART for good (a gateway's first frames of a call
    were lost so on a busy CI machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        topics = cluster_metadata(admin, errors, timeout_s).topics
        pending = [t.name for t in specs
                   if t.name not in topics or topics[t.name].error is not None
                   or len(topics[t.name].partitions) < t.partitions
                   or any(p.leader < 0 for p in topics[t.name].partitions.values())]
        if not pending:
            return
        if time.monotonic() > deadline:
            # Not a layout problem: the broker has not published what it created (overloaded, or down).
            raise KafkaUnavailableError(f"topic {pending[0]} was created but has no leader after {timeout_s:.0f} s")
        time.sleep(0.1)


class TopicLayoutError(ValueError):
    """Input topics whose partition counts would split a call between workers (one line, naming them)."""


def check_copartitioned(settings: Settings, timeout_s: float = 30.0) -> None:
    """Raise ``TopicLayoutError`` unless the audio, call-events and checkpoint topics have one partition
    count. The worker assumes it (Kafka Streams checks it and refuses to start): a call's frames and events,
    keyed by its id, land on partitions of the same number, which one worker owns, and that worker reads the
    call's resume point from the checkpoint partition of that number."""
    errors = ClientErrors(settings)
    admin = admin_client(settings, errors)
    names = (settings.topic_audio, settings.topic_call_events, settings.topic_checkpoints)
    deadline = time.monotonic() + timeout_s
    while True:  # topics just created may take a moment to reach the metadata
        topics = cluster_metadata(admin, errors, timeout_s).topics
        missing = [name for name in names if name not in topics or not topics[name].partitions]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise TopicLayoutError(f"topic {missing[0]} does not exist (`callqa topics create` makes it)")
        time.sleep(0.2)
    counts = {name: len(topics[name].partitions) for name in names}
    audio = counts.get(settings.topic_audio)
    differing = [f"{name} has {n}" for name, n in counts.items() if n != audio]
    if differing:
        raise TopicLayoutError(
            f"{settings.topic_audio} has {audio} partitions but {', '.join(differing)}: a call's frames, events and "
            "checkpoints must share a partition number (one count for all three, as `callqa topics create` makes them)")
