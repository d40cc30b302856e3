"""Produce and consume through the real local broker."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections import defaultdict

import pytest

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, Serde

pytestmark = pytest.mark.broker


def test_frames_of_a_call_share_a_partition_and_legs_stay_in_order(kafka_settings, read_topic) -> None:  # type: ignore[no-untyped-def]
    serde = Serde.from_settings()
    producer = ContractProducer(kafka_settings.bootstrap, serde)
    calls = [f"call-{i}" for i in range(8)]
    sent = 0
    for seq in range(25):
        for call in calls:
            for leg in ("agent", "customer"):
                producer.send(kafka_settings.topic_audio, call,
                              AudioFrame(call, leg, seq, seq * 20, 8000, "mulaw", bytes([seq]) * 160))
                sent += 1
    producer.flush()
    assert producer.delivered == sent

    msgs = read_topic(kafka_settings.bootstrap, kafka_settings.topic_audio, expected=sent)
    assert len(msgs) == sent
    partitions: dict[str, set[int]] = defaultdict(set)
    seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for m in msgs:
        frame = serde.decode(m.value(), AudioFrame)
        assert m.key().decode() == frame.call_id
        assert frame.payload == bytes([frame.seq]) * 160
        partitions[frame.call_id].add(m.partition())
        seqs[(frame.call_id, frame.leg)].append(frame.seq)
    assert all(len(p) == 1 for p in partitions.values())
    assert len({next(iter(p)) for p in partitions.values()}) > 1  # 8 calls spread over 12 partitions
    assert all(s == list(range(25)) for s in seqs.values())
    assert len(seqs) == 16


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is installed by `make test`")
def test_an_independent_client_reads_confluent_framed_frames(kafka_settings) -> None:  # type: ignore[no-untyped-def]
    serde = Serde.from_settings()
    producer = ContractProducer(kafka_settings.bootstrap, serde)
    frame = AudioFrame("kcat-call", "customer", 0, 0, 8000, "alaw", b"\xd5" * 160)
    producer.send(kafka_settings.topic_audio, frame.call_id, frame)
    producer.flush()

    out = subprocess.run(
        ["kcat", "-C", "-b", kafka_settings.bootstrap, "-t", kafka_settings.topic_audio,
         "-c", "1", "-e", "-f", "%k\\n%s", "-o", "beginning"],
        capture_output=True, timeout=60, check=True,
    ).stdout
    key, _, value = out.partition(b"\n")
    assert key == b"kcat-call"
    magic, schema_id = struct.unpack(">bI", value[:5])
    assert (magic, schema_id) == (0, serde.schema_id(AudioFrame.SCHEMA))
    assert serde.decode(value, AudioFrame) == frame
