"""Batches decoded in child processes (CALLQA_INFERENCE_PROCESSES): the same text as in-process, rows
released one by one, a killed child an error and not a hang, a clean close, a hot reload onto new children."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.batcher import BatcherClosedError, SegmentBatcher, inference_processes
from pipeline.asr.canary import ModelCanaryError
from pipeline.asr.engine import Engine
from pipeline.asr.inference_process import InferenceProcessError, ProcessBatcher, ProcessRecognizer
from pipeline.asr.manifest import ModelIntegrityError
from pipeline.asr.recognizer import Recognizer, SegmentRejectedError
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance


@pytest.mark.parametrize(("setting", "cores", "processes"), [(-1, 1, 0), (-1, 2, 2), (-1, 16, 2), (0, 16, 0), (3, 1, 3)])
def test_auto_is_two_processes_on_two_or_more_cores_and_none_on_one(
    monkeypatch: pytest.MonkeyPatch, setting: int, cores: int, processes: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    assert inference_processes(setting) == processes


def test_the_default_is_auto_and_the_suite_runs_in_process() -> None:
    """The suite's workers decode in-process (tests/conftest.py sets 0); a fresh environment gets auto."""
    assert Settings.model_fields["inference_processes"].default == -1
    assert Settings().inference_processes == 0


def _segments(utterances: list[EvalUtterance]) -> list[AudioSegment]:
    return [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]


def _process_batcher(recognizer: Recognizer, settings: Settings, processes: int) -> ProcessBatcher:
    batcher = Engine(recognizer, settings.model_copy(update={"inference_processes": processes})).new_batcher()
    assert isinstance(batcher, ProcessBatcher)
    return batcher


def _wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_a_child_gives_the_in_process_text_row_by_row(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """The same batch, the same tokens; a bad segment fails alone, each slot is told once, with its wait."""
    segments = _segments(eval_sets["8k-mulaw"][:6])
    bad = AudioSegment(0, 1000, np.full(16000, np.nan, np.float32))
    batch = [segments[0], bad, *segments[1:]]
    here = recognizer.recognize(batch)
    remote = ProcessRecognizer(recognizer.model.folder, asr_settings, 1, recognizer)
    try:
        told: list[int] = []
        there = remote.recognize(batch, [float(i) for i in range(len(batch))], False,
                                 lambda i, _: told.append(i))
    finally:
        remote.close()
    assert sorted(told) == list(range(len(batch)))
    assert isinstance(there[1], SegmentRejectedError)
    for i, (a, b) in enumerate(zip(here, there, strict=True)):
        if i == 1:
            continue
        assert isinstance(a, TranscriptResult) and isinstance(b, TranscriptResult)
        assert (b.tokens, b.text, b.model_version) == (a.tokens, a.text, a.model_version)
        assert b.avg_logprob == pytest.approx(a.avg_logprob, abs=1e-5)
        assert (b.timings.batch_size, b.timings.queue_wait_ms) == (6, float(i))


async def test_the_batcher_over_two_children_equals_in_process_and_closes_clean(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    segments = _segments(eval_sets["16k"][:8])
    alone = [recognizer.recognize([s])[0] for s in segments]
    batcher = _process_batcher(recognizer, asr_settings, 2)
    remote = batcher.recognizer
    assert isinstance(remote, ProcessRecognizer)
    assert batcher.inference_threads == 2
    children = list(remote._children)
    await batcher.start()
    together = await asyncio.gather(*(batcher.submit(s) for s in segments))
    await batcher.close()
    for one, got in zip(alone, together, strict=True):
        assert isinstance(one, TranscriptResult)
        assert got.tokens == one.tokens
    assert [c.process.exitcode for c in children] == [0, 0]  # asked to stop, and stopped
    assert not any(Path("/dev/shm", c.block.name).exists() for c in children)  # blocks unlinked
    with pytest.raises(BatcherClosedError):
        await batcher.submit(segments[0])


async def test_a_killed_child_fails_its_batch_with_an_error_and_is_replaced(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    segments = _segments(eval_sets["16k"][8:11])
    batcher = _process_batcher(recognizer, asr_settings, 1)
    remote = batcher.recognizer
    assert isinstance(remote, ProcessRecognizer)
    (pid,) = remote.pids
    assert pid is not None
    await batcher.start()
    os.kill(pid, signal.SIGSTOP)  # the batch reaches the child, which cannot answer it
    try:
        submitted = asyncio.gather(*(batcher.submit(s) for s in segments), return_exceptions=True)
        await asyncio.to_thread(_wait_for, lambda: remote.decoding == [pid], "the batch to reach the child")
    finally:
        os.kill(pid, signal.SIGKILL)
    outcomes = await asyncio.wait_for(submitted, 60)
    assert all(isinstance(o, InferenceProcessError) for o in outcomes), outcomes
    assert f"inference process {pid} (killed by signal 9)" in str(outcomes[0])
    assert batcher.error is None  # a failed batch, not a dead batcher
    again = await batcher.submit(segments[0])  # decoded by the child started in its place
    await batcher.close()
    assert remote.pids != [pid]
    assert again.tokens == recognizer.recognize([segments[0]])[0].tokens  # type: ignore[union-attr]


async def test_reload_moves_batches_to_new_children_and_stops_the_old(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]],
    place_version: Callable[..., Path], tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    first = place_version(models, 1)
    settings = asr_settings.model_copy(update={"models_dir": str(models)})
    local = Recognizer.load(first, settings)
    batcher: SegmentBatcher = _process_batcher(local, settings, 1)
    old = batcher.recognizer
    assert isinstance(old, ProcessRecognizer)
    old_children = list(old._children)
    segment = _segments(eval_sets["16k"][12:13])[0]
    await batcher.start()
    before = await batcher.submit(segment)
    new = await batcher.reload(place_version(models, 2), settings)
    after = await batcher.submit(segment)
    await batcher.close()
    assert isinstance(new, ProcessRecognizer) and new.pids != old.pids
    assert (before.model_version, after.model_version) == (1, 2)
    assert after.text == before.text
    assert [c.process.exitcode for c in old_children] == [0]  # retired once its batches ended


def test_a_child_that_cannot_load_the_folder_says_why(
    asr_settings: Settings, place_version: Callable[..., Path], tmp_path: Path
) -> None:
    """The folder changed after this process loaded it: the child's own refusal comes back."""
    folder = place_version(tmp_path / "models", 1)
    local = Recognizer.load(folder, asr_settings)
    (folder / "decoder.fp32.onnx").unlink()
    with pytest.raises(ModelIntegrityError, match="decoder.fp32.onnx"):
        ProcessRecognizer(folder, asr_settings, 1, local)


def test_a_batch_that_reaches_closed_children_is_decoded_here(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """A reload retires the old children while a batch formed on them is on its way: it is not lost."""
    segments = _segments(eval_sets["16k"][3:5])
    remote = ProcessRecognizer(recognizer.model.folder, asr_settings, 1, recognizer)
    remote.retire()  # no batch running: closes at once
    told: list[int] = []
    late = remote.recognize(segments, on_result=lambda i, _: told.append(i))
    assert sorted(told) == [0, 1]
    for here, there in zip(recognizer.recognize(segments), late, strict=True):
        assert isinstance(here, TranscriptResult) and isinstance(there, TranscriptResult)
        assert there.tokens == here.tokens


async def test_a_deferred_engine_decodes_in_its_children_and_loads_no_model_here(
    recognizer: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]],
    place_version: Callable[..., Path], tmp_path: Path,
) -> None:
    """The worker's engine (``defer``): only the children load the model, and they give the same text."""
    models = tmp_path / "models"
    place_version(models, 1)
    settings = asr_settings.model_copy(update={"models_dir": str(models), "inference_processes": 1})
    engine = Engine.load("tiny.en", settings=settings, defer=True)
    batcher = engine.new_batcher()
    remote = batcher.recognizer
    assert isinstance(remote, ProcessRecognizer)
    assert (remote.name, remote.version, remote.window) == ("tiny.en", 1, recognizer.window)
    segments = _segments(eval_sets["16k"][5:7])
    await batcher.start()
    got = await asyncio.gather(*(batcher.submit(s) for s in segments))
    await batcher.close()
    assert [r.tokens for r in got] == [r.tokens for r in recognizer.recognize(segments)]  # type: ignore[union-attr]
    assert engine._recognizer is None and remote._local is None  # no copy of the weights in this process


@pytest.mark.slow
def test_children_run_the_canary_when_this_process_did_not(
    asr_settings: Settings, place_version: Callable[..., Path], broken_decoder: Path, tmp_path: Path
) -> None:
    """A signed-and-intact but broken version is refused at a deferred worker's start, as in-process."""
    broken = place_version(tmp_path / "models", 1, decoder=broken_decoder)
    fp32 = asr_settings.model_copy(update={"quantization": "fp32"})
    with pytest.raises(ModelCanaryError, match=rf"^{broken}: refused: canary WER"):
        ProcessRecognizer(broken, fp32, 1)
    ProcessRecognizer(broken, fp32.model_copy(update={"model_canary": False}), 1).close()  # the canary refused it
