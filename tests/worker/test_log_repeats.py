"""Repeated client errors collapsed (pipeline/worker/log_repeats.py): one per template per window."""

from __future__ import annotations

import logging

import pytest

from pipeline.worker.log_repeats import CLIENT_LOGGERS, RepeatFilter, collapse_client_repeats


def test_one_record_per_template_per_window_and_the_next_says_how_many_were_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("callqa.test.repeats")
    logger.addFilter(RepeatFilter(10.0, clock=lambda: now[0]))
    with caplog.at_level(logging.ERROR, logger="callqa.test.repeats"):
        for i in range(1000):
            now[0] = i * 0.01  # 1000 retries in 10 s, two nodes: one template
            logger.error("Unable connect to node with id %s: refused", i % 2)
        logger.error("Unable to update metadata from %s", [1])  # another template: logged
        now[0] = 10.5
        logger.error("Unable connect to node with id %s: refused", 1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Unable connect to node with id 0: refused", "Unable to update metadata from [1]",
                     "Unable connect to node with id 1: refused (999 more like this in the last 10 s not logged)"]


def test_the_worker_attaches_one_filter_to_each_retrying_aiokafka_logger() -> None:
    collapse_client_repeats()
    collapse_client_repeats()
    for name in CLIENT_LOGGERS:
        assert sum(isinstance(f, RepeatFilter) for f in logging.getLogger(name).filters) == 1
    # Each name is a logger aiokafka really logs on (its modules use getLogger(__name__)).
    import importlib
    for name in CLIENT_LOGGERS:
        assert importlib.import_module(name).log.name == name  # type: ignore[attr-defined]
