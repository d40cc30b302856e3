"""SegmentBatcher: batched == alone, per-segment failures, back-pressure, model swap."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from pipeline.asr.batcher import BatcherClosedError, ModelVersionError, SegmentBatcher
from pipeline.asr.recognizer import Recognizer, SegmentRejectedError
from pipeline.asr.results import AudioSegment
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance


def _segments(utterances: list[EvalUtterance]) -> list[AudioSegment]:
    return [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]


def _mixed(eval_sets: dict[str, list[EvalUtterance]]) -> list[AudioSegment]:
    """Six utterances of 1.4-7.1 s, longer than the window bucket and shorter, with a 12 s one."""
    utterances = eval_sets["8k-mulaw"]
    picked = _segments([utterances[i] for i in (0, 3, 5, 9, 12, 19)])
    long_audio = np.concatenate([utterances[0].audio, utterances[2].audio])
    return [*picked, AudioSegment(0, long_audio.size // 16, long_audio)]


@pytest.mark.slow
async def test_batch_of_mixed_lengths_equals_each_alone(
    recognizer_fp32: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """fp32: batching (padding, masks, lockstep steps) changes nothing. (int8 quantizes activations per
    tensor, so there the batch's other rows can nudge a score; see models/README.md.)"""
    segments = _mixed(eval_sets)
    alone = [recognizer_fp32.recognize([s])[0] for s in segments]
    batcher = SegmentBatcher(recognizer_fp32, max_batch=16, max_wait_ms=200)
    await batcher.start()
    together = await asyncio.gather(*(batcher.submit(s) for s in segments))
    await batcher.close()
    assert {r.timings.batch_size for r in together} == {len(segments)}
    for one, batched in zip(alone, together, strict=True):
        assert not isinstance(one, Exception)
        assert batched.tokens == one.tokens
        assert batched.avg_logprob == pytest.approx(one.avg_logprob, abs=1e-3)
        assert batched.timings.queue_wait_ms >= 0


async def test_bad_segment_fails_only_itself(
    recognizer: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    good = _segments(eval_sets["16k"][5:8])
    bad = AudioSegment(0, 1000, np.full(16000, np.nan, np.float32))
    batcher = SegmentBatcher(recognizer, max_batch=8, max_wait_ms=200)
    await batcher.start()
    outcomes = await asyncio.gather(
        *(batcher.submit(s) for s in [good[0], bad, *good[1:]]), return_exceptions=True
    )
    await batcher.close()
    assert isinstance(outcomes[1], SegmentRejectedError)
    assert [type(o).__name__ for o in outcomes].count("TranscriptResult") == 3
    with pytest.raises(BatcherClosedError):
        await batcher.submit(good[0])


@pytest.mark.slow
def test_decode_failure_is_isolated_to_its_segment(
    recognizer: Recognizer, eval_sets: dict[str, list[EvalUtterance]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure inside the batched decode (not input validation) is retried row by row."""
    segments = _segments(eval_sets["16k"][5:9])
    poison = segments[2].audio.size // 160
    real_decode = recognizer.decoder.decode

    def decode(mels, durations, wide=False, on_final=None, contexts=None):  # type: ignore[no-untyped-def]
        if any(m.shape[1] == poison for m in mels):
            raise RuntimeError("onnxruntime failed")
        return real_decode(mels, durations, wide, on_final)

    monkeypatch.setattr(recognizer.decoder, "decode", decode)
    slots = recognizer.recognize(segments)
    assert isinstance(slots[2], RuntimeError)
    assert all(not isinstance(s, Exception) and s.text for i, s in enumerate(slots) if i != 2)


@pytest.mark.slow
def test_each_segment_is_released_once_when_its_own_decoding_ends(
    recognizer_fp32: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """Rows decode in lockstep, so a row with fewer tokens ends (and is told) first, while the batch runs
    on; every row is told exactly once, with the result the batch returns for it. Row 2 ("10 of clubs")
    loops in its 2 s window, so it is final only after its retry in the 10 s window: told last."""
    segments = _mixed(eval_sets)
    told: list[tuple[int, Any, bool]] = []
    returned = threading.Event()

    def on_result(i: int, outcome: Any) -> None:
        told.append((i, outcome, returned.is_set()))

    slots = recognizer_fp32.recognize(segments, on_result=on_result)
    returned.set()
    assert sorted(i for i, _, _ in told) == list(range(len(segments)))
    assert not any(after for _, _, after in told)
    assert told[-1][0] == 2
    lengths = [len(outcome.tokens) for _, outcome, _ in told[:-1]]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    for i, outcome, _ in told:
        assert outcome.tokens == slots[i].tokens  # type: ignore[union-attr]
    # Told earlier than the batch's end: its own inference time is shorter than the longest row's.
    assert told[0][1].timings.inference_ms < told[-2][1].timings.inference_ms < told[-1][1].timings.inference_ms


def test_a_bad_segment_is_told_at_once_and_only_once(
    recognizer: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    good = _segments(eval_sets["16k"][:2])
    bad = AudioSegment(0, 1000, np.full(16000, np.nan, np.float32))
    told: list[tuple[int, Any]] = []
    recognizer.recognize([good[0], bad, good[1]], on_result=lambda i, outcome: told.append((i, outcome)))
    assert told[0][0] == 1 and isinstance(told[0][1], SegmentRejectedError)
    assert sorted(i for i, _ in told) == [0, 1, 2]


async def test_submit_waits_while_the_queue_is_full(
    recognizer: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    segment = _segments(eval_sets["16k"][12:13])[0]
    batcher = SegmentBatcher(recognizer, max_batch=4, max_wait_ms=5, queue_size=2)
    submits = [asyncio.create_task(batcher.submit(segment)) for _ in range(3)]
    await asyncio.sleep(0.05)  # not started: nothing drains the queue
    assert batcher.queued == 2
    assert not any(t.done() for t in submits)
    await batcher.start()
    results = await asyncio.gather(*submits)
    await batcher.close()
    assert len({r.text for r in results}) == 1


async def test_swap_refuses_older_and_serves_newer(
    recognizer: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    segment = _segments(eval_sets["16k"][12:13])[0]
    batcher = SegmentBatcher(recognizer, max_wait_ms=1)
    await batcher.start()
    with pytest.raises(ModelVersionError, match="not newer than the running version 1"):
        batcher.swap(recognizer)
    before = await batcher.submit(segment)
    newer_model = replace(recognizer.model, manifest=replace(recognizer.model.manifest, version=2))
    batcher.swap(Recognizer(newer_model, recognizer.decoder.options))
    after = await batcher.submit(segment)
    await batcher.close()
    assert (before.model_version, after.model_version) == (1, 2)
    assert after.text == before.text


class MeetingRecognizer:
    """Each batch waits until another batch is running at the same time (or gives up after 20 s)."""

    name, version = "meeting", 1

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=20)
        self.met = 0

    def recognize(self, segments: Any, waits: Any = None, wide: bool = False, on_result: Any = None,
                  contexts: Any = None) -> list[Any]:
        try:
            self.barrier.wait()
            self.met += 1
        except threading.BrokenBarrierError:
            pass
        return [SegmentRejectedError("not decoded here") for _ in segments]


class OneWindow:
    def window_frames(self, frames: int) -> int:
        return 3000


async def test_batches_run_at_once_on_several_inference_threads() -> None:
    recognizer = MeetingRecognizer(parties=2)
    batcher = SegmentBatcher(recognizer, window=OneWindow(), max_batch=1, max_wait_ms=1,  # type: ignore[arg-type]
                             inference_threads=2)
    await batcher.start()
    segment = AudioSegment(0, 1000, np.zeros(16000, np.float32))
    outcomes = await asyncio.gather(*(batcher.submit(segment) for _ in range(2)), return_exceptions=True)
    await batcher.close()
    assert all(isinstance(o, SegmentRejectedError) for o in outcomes)
    assert recognizer.met == 2, "the two batches did not run at the same time"


@pytest.mark.slow
async def test_the_idle_wide_encoder_gives_the_same_tokens(
    built: Any, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """A batch nothing waits behind encodes on every core: bit-identical, so text never depends on load."""
    # window_bucket_s 0: every window is the full 30 s one, the only one that encodes wide.
    settings = asr_settings.model_copy(update={"quantization": "fp32", "intra_op_threads": 1, "idle_encoder_threads": 2,
                                               "window_bucket_s": 0.0})
    recognizer = Recognizer.load(built.folder, settings)
    assert recognizer.model.encoder_wide is not None
    segments = _mixed(eval_sets)
    narrow, wide = recognizer.recognize(segments), recognizer.recognize(segments, wide=True)
    for a, b in zip(narrow, wide, strict=True):
        assert not isinstance(a, Exception) and not isinstance(b, Exception)
        assert (a.tokens, a.avg_logprob, a.no_speech_prob) == (b.tokens, b.avg_logprob, b.no_speech_prob)


class WideRecorder:
    """Records, per batch, whether the batcher let it encode wide."""

    name, version = "wide", 1

    def __init__(self) -> None:
        self.wide: list[bool] = []

    def recognize(self, segments: Any, waits: Any = None, wide: bool = False, on_result: Any = None,
                  contexts: Any = None) -> list[Any]:
        self.wide.append(wide)
        return [SegmentRejectedError("not decoded here") for _ in segments]


async def test_only_a_batch_nothing_waits_behind_runs_wide() -> None:
    recognizer = WideRecorder()
    batcher = SegmentBatcher(recognizer, window=OneWindow(), max_batch=1, max_wait_ms=1)  # type: ignore[arg-type]
    await batcher.start()
    segment = AudioSegment(0, 1000, np.zeros(16000, np.float32))
    await asyncio.gather(batcher.submit(segment), return_exceptions=True)
    await asyncio.gather(*(batcher.submit(segment) for _ in range(3)), return_exceptions=True)
    await batcher.close()
    assert recognizer.wide[0] is True  # alone
    assert recognizer.wide[1] is False and recognizer.wide[-1] is True  # two waited behind the first
