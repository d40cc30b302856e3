"""A finished call's audio, read back from the audio topic for the post-call pass.

The worker keeps no audio once a segment is transcribed, and holding every segment's audio until its
call ends would cost ~32 KB per speech-second per leg in the worker (float32 at 16 kHz) and in its
checkpoints. The audio topic already keeps every frame for ``audio_retention_ms`` (6 h): the pass reads
the call's partition from the call's first frame (by Kafka timestamp) to the offset the worker had read
when the call finished, keeps the call's frames, and lays each leg out as the live worker did: frames by
seq, a duplicate dropped, a missing frame as silence, frames 0..n-1 of the job's ``frame_counts``.

What it costs: the frames of the calls sharing the partition in that time are read too (the job's
``callqa_postcall_read_bytes_total{whose="other"}``); about the partition's concurrent calls times the
call's own audio, read sequentially from the broker's page cache or disk, none of it decoded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pipeline.audio import codecs
from pipeline.contracts.messages import AudioFrame, Leg, PostCallJob
from pipeline.contracts.serde import ContractError, Serde


class CallAudioError(RuntimeError):
    """The call's audio could not be read back (expired, or the topic unreadable); names call and why."""


class AudioGone(CallAudioError):
    """Nothing of the call's audio can be read any more: its topic or partition no longer exists, or the
    partition's log starts past the call's last frame. Told from metadata and watermarks before any read,
    so a job for it is skipped at once instead of waiting on a partition that will never answer."""

    def __init__(self, call_id: str, tp: TopicPartition, reason: str, detail: str) -> None:
        super().__init__(f"call {call_id}: its audio on {tp.topic}[{tp.partition}] is gone ({reason}: {detail})")
        self.call_id = call_id
        self.topic = tp.topic
        self.partition = tp.partition
        self.reason = reason  # topic_gone | partition_gone | expired


# The broker's (or librdkafka's) answers for a topic or partition that does not exist.
GONE_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})
METADATA_TIMEOUT_S = 5.0


@dataclass
class LegAudio:
    sample_rate: int
    samples: np.ndarray  # float32 in [-1, 1], the leg from its first frame
    frames: int
    missing: int  # frames filled with silence


@dataclass
class CallAudio:
    call_id: str
    legs: dict[Leg, LegAudio]
    call_bytes: int = 0  # the call's frames read
    other_bytes: int = 0  # other calls' frames read on the way
    undecodable: int = 0  # messages of the call that did not decode (they were dead-lettered live)
    extra: dict[str, int] = field(default_factory=dict)  # frames past a leg's count, by leg (ignored)


def assemble(job: PostCallJob, frames: Iterable[AudioFrame]) -> CallAudio:
    """Each leg of ``job`` laid out as the live worker heard it: frames 0..n-1 by seq, first copy kept,
    missing ones as silence (zeros, as the worker's jitter buffer fills them)."""
    by_leg: dict[Leg, dict[int, AudioFrame]] = {}
    extra: dict[str, int] = {}
    for frame in frames:
        count = job.frame_counts.get(frame.leg)
        if count is None or frame.seq >= count:
            extra[frame.leg] = extra.get(frame.leg, 0) + 1
            continue
        by_leg.setdefault(frame.leg, {}).setdefault(frame.seq, frame)
    legs: dict[Leg, LegAudio] = {}
    for leg, seqs in by_leg.items():
        first = seqs[min(seqs)]
        frame_samples = len(codecs.decode(first.payload, first.encoding))
        count = job.frame_counts[leg]
        out = np.zeros(count * frame_samples, dtype=np.float32)
        for seq, frame in seqs.items():
            samples = codecs.decode(frame.payload, frame.encoding)[:frame_samples]
            out[seq * frame_samples: seq * frame_samples + len(samples)] = samples
        legs[leg] = LegAudio(first.sample_rate, out, count, count - len(seqs))
    return CallAudio(job.call_id, legs, extra=extra)


def read_call_audio(consumer_config: dict[str, object], serde: Serde, job: PostCallJob) -> CallAudio:
    """The call's legs from the audio topic (``read_call_frames`` then ``assemble``), with what was read."""
    frames, tally = read_call_frames(consumer_config, serde, job)
    audio = assemble(job, frames)
    audio.call_bytes, audio.other_bytes, audio.undecodable = tally.call_bytes, tally.other_bytes, tally.undecodable
    return audio


def read_call_frames(consumer_config: dict[str, object], serde: Serde, job: PostCallJob,
                     poll_timeout_s: float = 1.0, max_idle_polls: int = 30) -> tuple[list[AudioFrame], CallAudio]:
    """The call's frames on its audio partition, between its first frame's time and ``audio_end_offset``.

    ``consumer_config``: librdkafka settings (bootstrap, security); the consumer is assigned the one
    partition (no group, nothing committed). Raises CallAudioError when the audio has expired or the
    partition does not answer."""
    return read_keyed_frames(consumer_config, serde, job.call_id, TopicPartition(job.audio_topic, job.audio_partition),
                             job.audio_from_ms, job.audio_end_offset, poll_timeout_s, max_idle_polls)


def read_keyed_frames(consumer_config: dict[str, object], serde: Serde, call_id: str, tp: TopicPartition,
                      from_ms: int, end_offset: int, poll_timeout_s: float = 1.0,
                      max_idle_polls: int = 30) -> tuple[list[AudioFrame], CallAudio]:
    """The frames keyed ``call_id`` on ``tp`` from its first message at or after ``from_ms`` up to
    ``end_offset`` (exclusive), and what was read on the way."""
    consumer = Consumer({**consumer_config, "group.id": f"callqa-postcall-reader-{call_id}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        check_audio_present(consumer, call_id, tp)
        try:
            low, _ = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10.0)
            if low >= end_offset:  # what is left of the partition all came after the call's last frame
                raise AudioGone(call_id, tp, "expired", f"the log starts at offset {low}, the call ended before "
                                f"{end_offset}")
            (start,) = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, from_ms)], timeout=10.0)
        except KafkaException as exc:
            raise _gone_or(exc, call_id, tp) from exc
        begin = start.offset if start.offset >= 0 else end_offset
        if begin >= end_offset:
            return [], CallAudio(call_id, {})
        consumer.assign([TopicPartition(tp.topic, tp.partition, begin)])
        return _read_until(consumer, serde, call_id, tp, end_offset, poll_timeout_s, max_idle_polls)
    finally:
        consumer.close()


def check_audio_present(consumer: Consumer, call_id: str, tp: TopicPartition) -> None:
    """Raises AudioGone when the broker's metadata has no ``tp`` (its topic deleted, or fewer partitions):
    one metadata request, where reading it would wait on a partition that never answers."""
    try:
        topic = consumer.list_topics(tp.topic, timeout=METADATA_TIMEOUT_S).topics.get(tp.topic)
    except KafkaException as exc:
        raise _gone_or(exc, call_id, tp) from exc
    if topic is None or (topic.error is not None and topic.error.code() in GONE_CODES):
        raise AudioGone(call_id, tp, "topic_gone", "the broker does not know the topic")
    if topic.error is None and tp.partition not in topic.partitions:
        raise AudioGone(call_id, tp, "partition_gone", f"the topic has {len(topic.partitions)} partitions")


def _gone_or(exc: KafkaException, call_id: str, tp: TopicPartition) -> CallAudioError:
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if error is not None and error.code() in GONE_CODES:
        return AudioGone(call_id, tp, "topic_gone" if error.code() != KafkaError._UNKNOWN_PARTITION
                         else "partition_gone", error.str())
    return CallAudioError(f"call {call_id}: {tp.topic}[{tp.partition}]: {exc}")


def partition_span(consumer_config: dict[str, object], tp: TopicPartition, from_ms: int, to_ms: int) -> tuple[int, int]:
    """The offsets of ``tp`` whose messages were written between ``from_ms`` and ``to_ms``: [begin, end)."""
    consumer = Consumer({**consumer_config, "group.id": "callqa-postcall-span", "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10.0)
        # One lookup per time: librdkafka answers a request naming a partition twice with one of the times.
        (begin,) = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, from_ms)], timeout=10.0)
        (end,) = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, to_ms)], timeout=10.0)
        return max(low, begin.offset if begin.offset >= 0 else high), end.offset if end.offset >= 0 else high
    finally:
        consumer.close()


def _read_until(consumer: Consumer, serde: Serde, call_id: str, tp: TopicPartition, end_offset: int,
                poll_timeout_s: float, max_idle_polls: int) -> tuple[list[AudioFrame], CallAudio]:
    frames: list[AudioFrame] = []
    tally = CallAudio(call_id, {})
    key = call_id.encode()
    idle = 0
    while True:
        messages = consumer.consume(500, timeout=poll_timeout_s)
        if not messages:
            idle += 1
            # An assigned partition whose topic was deleted meanwhile gives no error, only silence.
            check_audio_present(consumer, call_id, tp)
            if idle >= max_idle_polls:
                raise CallAudioError(f"call {call_id}: {tp.topic}[{tp.partition}] gave nothing "
                                     f"for {idle * poll_timeout_s:.0f} s before offset {end_offset}")
            continue
        idle = 0
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return frames, tally
                raise CallAudioError(f"call {call_id}: reading its audio: {error.str()}")
            offset = message.offset()
            if offset is not None and offset >= end_offset:
                return frames, tally
            value = message.value() or b""
            if message.key() != key:
                tally.other_bytes += len(value)
                continue
            tally.call_bytes += len(value)
            try:
                frames.append(serde.decode(value, AudioFrame))
            except ContractError:
                tally.undecodable += 1
