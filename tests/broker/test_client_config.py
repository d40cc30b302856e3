"""Every librdkafka client callqa builds goes back to bootstrap_servers soon after losing every broker it knew.

Why (seen in the chaos test and reproduced with replays through broker restarts, librdkafka 2.16): a broker
that restarts answers metadata with no brokers while it is fenced; a client that asks then forgets broker 1
and its bootstrap handle, and by default bootstraps again only after 5 minutes. Its producer sent nothing more
and failed the call's remaining audio as timed out."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer

from pipeline.broker.security import kafka_config
from pipeline.config import Settings


def test_client_config_rebootstraps_after_the_setting_and_reads_its_environment_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    conf = kafka_config(Settings())
    assert conf["metadata.recovery.strategy"] == "rebootstrap"
    assert conf["metadata.recovery.rebootstrap.trigger.ms"] == 2000
    monkeypatch.setenv("CALLQA_KAFKA_REBOOTSTRAP_MS", "2500")
    assert kafka_config(Settings())["metadata.recovery.rebootstrap.trigger.ms"] == 2500


def test_the_installed_librdkafka_takes_the_rebootstrap_properties() -> None:
    # librdkafka refuses a property it does not know: building the clients is the check that it has KIP-899's.
    conf = kafka_config(Settings(bootstrap_servers="127.0.0.1:1"))
    Producer(conf).flush(0)
    Consumer({**conf, "group.id": "rebootstrap-check"}).close()
