"""Which model the post-call pass uses: a job is kept only where the pass can differ from the
live record, so the live model named as the final one means no pass (and the worker says so)."""

from __future__ import annotations

import logging

import pytest

from pipeline.config import Settings
from pipeline.worker.app import post_call_runner


def test_the_live_model_as_final_model_means_no_pass(caplog: pytest.LogCaptureFixture) -> None:
    assert Settings().final_model == "" and Settings().post_call_model == ""  # off by default
    same = Settings(final_model=Settings().model, recordings=False)  # recordings would take the jobs
    assert same.post_call_model == ""
    with caplog.at_level(logging.WARNING, logger="callqa.worker"):
        assert post_call_runner(same, None, None, None, None, None) is None  # type: ignore[arg-type]
    assert "would decode the same text again" in caplog.text


def test_a_cheaper_live_model_keeps_its_post_call_pass() -> None:
    assert Settings(model="tiny.en", final_model="moonshine-base").post_call_model == "moonshine-base"
