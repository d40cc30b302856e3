"""The streaming verbs (sherpa-onnx's shape): many legs' streams, the ready ones decoded in one batch, a
closed segment of each before partials, partials superseded by their finals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from pipeline.asr.engine import Engine
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import SegmentAudio, TranscriptResult
from pipeline.asr.streams import StreamDecoder
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.wer import word_error_rate

SILENCE = np.zeros(16000, np.float32)


class CountingRecognizer:
    """A real recogniser that remembers each batch it was given (start_ms and audio length per row)."""

    def __init__(self, inner: Recognizer) -> None:
        self.inner = inner
        self.batches: list[list[tuple[int, int]]] = []

    def recognize(self, segments: Sequence[SegmentAudio], **kwargs: object) -> list[TranscriptResult | Exception]:
        self.batches.append([(s.start_ms, s.audio.size) for s in segments])
        return self.inner.recognize(segments, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def counting(recognizer: Recognizer) -> CountingRecognizer:
    return CountingRecognizer(recognizer)


def _engine(counting: CountingRecognizer, settings: Settings, **changes: object) -> tuple[Engine, StreamDecoder]:
    engine = Engine(counting.inner, settings.model_copy(update=changes))
    decoder = StreamDecoder(counting, int(changes.get("max_batch", 16)),  # type: ignore[arg-type]
                            int(changes.get("partial_interval_ms", 0)), context=False)  # type: ignore[arg-type]
    engine._streams = decoder  # the engine's verbs, through the counting recogniser
    return engine, decoder


def test_ready_streams_decode_together_and_each_gets_its_own_text(
    counting: CountingRecognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    engine, _ = _engine(counting, asr_settings)
    utterances = eval_sets["16k"][:3]
    streams = [engine.create_stream(sample_rate=16000, encoding="pcm16") for _ in utterances]
    for stream, u in zip(streams, utterances, strict=True):
        for i in range(0, u.audio.size, 320):  # 20 ms at a time
            stream.accept_waveform(u.audio[i : i + 320])
        stream.input_finished()
    assert all(engine.is_ready(s) for s in streams)
    while ready := [s for s in streams if engine.is_ready(s)]:
        engine.decode_streams(ready)
    assert len(counting.batches[0]) == 3  # one closed segment of each leg, in one batch
    texts = []
    for stream in streams:
        assert engine.is_endpoint(stream)
        result = engine.get_result(stream)
        texts.append(" ".join(r.text for r in result.finals))
        assert not engine.is_endpoint(stream) and engine.get_result(stream).finals == ()  # taken once
    assert word_error_rate([u.reference for u in utterances], texts) <= 0.2, texts
    with pytest.raises(ValueError, match="finished"):
        streams[0].accept_waveform(SILENCE)


def test_finals_fill_the_batch_before_partials_and_partials_wait_their_turn(
    counting: CountingRecognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    # The keypad detector off: it holds 66-100 ms of each stream back, and partials are timed to the sample here.
    engine, _ = _engine(counting, asr_settings, max_batch=2, partial_interval_ms=500, keypad_tones=False)
    long = [u for u in eval_sets["16k"] if u.audio.size > 3 * 16000][:3]
    closed, open_a, open_b = (engine.create_stream(16000, "pcm16") for _ in range(3))
    closed.accept_waveform(np.concatenate([SILENCE, long[0].audio, SILENCE]))  # speech, then its endpoint
    for stream, u in ((open_a, long[1]), (open_b, long[2])):
        stream.accept_waveform(np.concatenate([SILENCE, u.audio[: 2 * 16000]]))  # still speaking
    assert closed.closed and not open_a.closed and not open_b.closed
    assert engine.is_ready(open_a) and engine.is_ready(open_b)  # partials due

    final_start = closed.closed[0].start_ms
    partial_start = open_a.front_end.segmenter.open_segment_start_ms
    engine.decode_streams([open_a, open_b, closed])
    assert [row[0] for row in counting.batches[-1]] == [final_start, partial_start]  # max_batch 2: final first
    assert not closed.closed and engine.is_endpoint(closed)  # the final went first
    assert engine.get_result(open_a).partial and engine.get_result(open_b).partial == ""  # b waits
    assert engine.is_ready(open_b) and not engine.is_ready(open_a)  # a's partial is fresh, b's still due

    engine.decode_streams([open_a, open_b])
    assert len(counting.batches[-1]) == 1 and engine.get_result(open_b).partial
    # a's speech goes on: its next partial is due only after another 500 ms of it
    open_a.accept_waveform(long[1].audio[2 * 16000 : 2 * 16000 + 4000])
    assert not engine.is_ready(open_a)
    open_a.accept_waveform(long[1].audio[2 * 16000 + 4000 : 2 * 16000 + 8000])
    assert engine.is_ready(open_a)

    # its segment closes: the final supersedes the partial
    open_a.accept_waveform(np.concatenate([long[1].audio[2 * 16000 + 8000 :], SILENCE]))
    assert open_a.closed and engine.get_result(open_a).partial == ""
    engine.decode_streams([open_a])
    result = engine.get_result(open_a)
    assert len(result.finals) == 1 and word_error_rate([long[1].reference], [result.finals[0].text]) <= 0.25
