"""The worker's consumer fetches with callqa's sizes, not faust's fixed ones (pipeline/broker/fetch.py)."""

from __future__ import annotations

from pathlib import Path

import faust

from pipeline.broker.fetch import FAUST_FETCH_MAX_WAIT_MS, SizedFetchConsumer, use_fetch_sizes


def _app(tmp_path: Path) -> faust.App:
    return faust.App("fetch-test", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path / "{conf.name}"))


async def test_the_aiokafka_consumer_faust_makes_carries_the_fetch_sizes(tmp_path: Path) -> None:
    app = _app(tmp_path)
    use_fetch_sizes(app, 65536, 20)
    assert isinstance(app.consumer, SizedFetchConsumer)
    client = app.consumer._thread._create_worker_consumer(app.transport)  # what its thread starts
    # What aiokafka hands its fetcher when it starts (AIOKafkaConsumer.start).
    assert (client._fetch_min_bytes, client._fetch_max_wait_ms) == (65536, 20)


async def test_without_fetch_sizes_faust_keeps_its_own(tmp_path: Path) -> None:
    app = _app(tmp_path)
    client = app.consumer._thread._create_worker_consumer(app.transport)
    assert not isinstance(app.consumer, SizedFetchConsumer)
    assert (client._fetch_min_bytes, client._fetch_max_wait_ms) == (1, FAUST_FETCH_MAX_WAIT_MS)
