"""The worker's input topics must co-partition (pipeline/broker/topics.py ``check_copartitioned``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.broker.topics import TopicLayoutError, check_copartitioned, ensure_topics
from pipeline.config import Settings

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]


def _settings(broker: str, name: str, events_partitions: int) -> Settings:
    prefix = f"test.{name}"
    return Settings(bootstrap_servers=broker, topic_audio=f"{prefix}.audio", topic_call_events=f"{prefix}.events",
                    topic_checkpoints=f"{prefix}.checkpoints", topic_transcripts=f"{prefix}.transcripts",
                    topic_latency=f"{prefix}.latency", topic_qa=f"{prefix}.qa", topic_dead_letters=f"{prefix}.dlq",
                    topic_postcall=f"{prefix}.postcall", topic_live_calls=f"{prefix}.live", audio_partitions=4,
                    events_partitions=events_partitions,
                    worker_id=f"{prefix}.worker")


def test_topics_of_one_count_pass(broker: str, unique_name: str) -> None:
    settings = _settings(broker, unique_name, 4)
    ensure_topics(settings)
    check_copartitioned(settings)  # no error


def test_an_events_topic_of_another_count_is_refused_and_the_worker_does_not_start(
        broker: str, unique_name: str, tmp_path: Path) -> None:
    settings = _settings(broker, unique_name, 3)
    ensure_topics(settings)
    with pytest.raises(TopicLayoutError, match=rf"{settings.topic_audio} has 4 partitions but "
                                               rf"{settings.topic_call_events} has 3"):
        check_copartitioned(settings)
    env = {"PATH": "/usr/bin:/bin", "CALLQA_STATE_DIR": str(tmp_path / "state"),
           **{f"CALLQA_{k.upper()}": str(v) for k, v in settings.model_dump().items()
              if k.startswith("topic_") or k in ("bootstrap_servers", "worker_id", "audio_partitions",
                                                 "events_partitions")}}
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert f"{settings.topic_call_events} has 3" in done.stderr and "Traceback" not in done.stderr


def test_the_compacted_checkpoint_topic_rolls_its_segments_so_compaction_runs(broker: str, unique_name: str) -> None:
    """Kafka compacts closed segments only; by default one closes at 1 GB or after 7 days, so checkpoints
    were never compacted in practice."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    settings = _settings(broker, unique_name, 4)
    ensure_topics(settings)
    check_copartitioned(settings)  # waits until the new topics are in the metadata
    admin = AdminClient({"bootstrap.servers": broker})
    # The live desk's calls in progress too: a desk that starts reads all of it.
    for topic in (settings.topic_checkpoints, settings.topic_live_calls):
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        config = admin.describe_configs([resource])[resource].result(30)
        assert config["cleanup.policy"].value == "compact"
        # A minute or 16 MB: the open segment, never compacted, is what every take-over reads.
        assert (config["segment.ms"].value, config["segment.bytes"].value,
                config["min.cleanable.dirty.ratio"].value) == ("60000", str(16 * 1024 * 1024), "0.1")
