"""The faust-streaming API the worker uses beyond faust's public one, checked on the installed faust
(pyproject.toml pins faust-streaming to the minor range these pass on):

- ``Consumer._commit_offsets(offsets)``: faust has no public call that commits given offsets, and the
  worker commits its own (``commit_durable`` and the revocation hand-over, pipeline/worker/app.py): a
  mapping TP -> offset in, True when committed, False (nothing committed) for partitions not assigned,
  and it still commits from ``on_partitions_revoked``, before the partitions are handed over;
- the module loggers that print message payloads at DEBUG (``PAYLOAD_LOGGERS``, kept at INFO so no
  transcript or audio reaches the worker's log): named after faust's and aiokafka's module paths.

A faust or aiokafka upgrade that renames or changes one of these fails here rather than in a worker."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import time
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import faust
import pytest
from confluent_kafka import Producer
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

from pipeline.broker.groups import committed_offsets
from pipeline.broker.security import faust_credentials, kafka_config
from pipeline.config import Settings
from pipeline.worker.app import PAYLOAD_LOGGERS


def _app(settings: Settings, datadir: Path) -> faust.App:
    """A faust app of the worker's group reading its audio topic like the worker (acks off), no web server;
    its data folder ``datadir`` (faust's default is one in the working directory)."""
    app = faust.App(settings.worker_id, broker=f"kafka://{settings.bootstrap}",
                    broker_credentials=faust_credentials(settings), store="memory://", web_enabled=False,
                    datadir=str(datadir))
    topic = app.topic(settings.topic_audio, key_serializer="raw", value_serializer="raw", acks=False)

    @app.agent(topic, name="audio")
    async def audio(stream: Any) -> None:
        async for _ in stream:
            pass

    return app


async def _commit(app: faust.App, offsets: dict[TP, int]) -> bool:
    """The call app.py makes (commit_now): the given offsets, nothing else."""
    result: bool = await app.consumer._commit_offsets(offsets)  # type: ignore[attr-defined]
    return result


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        await asyncio.sleep(0.1)


async def test_commit_offsets_is_the_coroutine_the_worker_calls(tmp_path: Path) -> None:
    """No broker needed: the app is built, not started."""
    consumer = _app(Settings(worker_id="faust-contract"), tmp_path).consumer
    assert type(consumer) is AIOKafkaConsumer  # the class whose _commit_offsets app.py calls
    method = type(consumer)._commit_offsets
    assert inspect.iscoroutinefunction(method)
    signature = inspect.signature(method)
    assert list(signature.parameters) == ["self", "offsets", "start_new_transaction"]
    assert signature.parameters["start_new_transaction"].default is True  # app.py passes offsets only
    hints = typing.get_type_hints(method)
    assert typing.get_origin(hints["offsets"]) is Mapping and typing.get_args(hints["offsets"]) == (TP, int)
    assert hints["return"] is bool


async def test_commit_offsets_commits_assigned_partitions_also_while_they_are_revoked(
    kafka_settings: Settings, tmp_path: Path
) -> None:
    """On the real broker, as app.py uses it: a commit of assigned partitions lands and says True; one
    of a partition not assigned says False and commits nothing; and from ``on_partitions_revoked``
    (a second member joins: faust revokes every partition) the revoked partitions still commit."""
    settings, group, audio = kafka_settings, kafka_settings.worker_id, kafka_settings.topic_audio
    producer = Producer(kafka_config(settings))
    for _ in range(10):
        producer.produce(audio, key=b"c1", value=b"frame", partition=0)
    assert producer.flush(30) == 0

    first = _app(settings, tmp_path / "first")
    during_revoke: list[tuple[set[TP], bool]] = []

    @first.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def hand_over(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        ours = {tp for tp in revoked if tp.topic == audio}
        if ours:  # faust also signals an empty revocation when it first joins
            during_revoke.append((ours, await _commit(first, {tp: 3 for tp in ours})))

    second = _app(settings, tmp_path / "second")
    try:
        await first.start()
        await _until(lambda: any(tp.topic == audio for tp in first.consumer.assignment()), "first assignment")
        assert await _commit(first, {TP(audio, 0): 7}) is True
        assert committed_offsets(settings, group, audio) == {0: 7}
        assert await _commit(first, {TP(settings.topic_call_events, 0): 5}) is False
        assert committed_offsets(settings, group, settings.topic_call_events) == {}

        await second.start()
        await _until(lambda: bool(during_revoke), "revocation")
        revoked, did_commit = during_revoke[0]
        assert did_commit is True
        assert committed_offsets(settings, group, audio) == {tp.partition: 3 for tp in revoked}
    finally:
        await second.stop()
        await first.stop()


@pytest.mark.parametrize("name", PAYLOAD_LOGGERS)
def test_the_payload_loggers_are_the_modules_loggers(name: str) -> None:
    """Each name is a module of faust or aiokafka whose own logger has that name: a module that moved
    would leave its payload lines at the worker's log level."""
    module = importlib.import_module(name)
    loggers = [value for value in vars(module).values() if isinstance(value, logging.Logger)]
    assert [logger.name for logger in loggers] == [name]
