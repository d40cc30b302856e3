"""Beam search (AsrSettings.beam_size): the bookkeeping of one segment's hypotheses, and the decoder's
batched beams against faster-whisper's beam search on the same weights (a slice of the eval set here;
all of it in `callqa bench check`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.asr.beam import Hypothesis, SegmentBeam
from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.guards import beam_reference_guard

EOT = 0


def _step(beam: SegmentBeam, rows: list[list[tuple[int, float]]], stop=lambda t: False) -> list[int]:  # type: ignore[no-untyped-def]
    k = beam.candidates_per_row
    tokens = np.array([[t for t, _ in r] + [99] * (k - len(r)) for r in rows])
    logprobs = np.array([[lp for _, lp in r] + [-np.inf] * (k - len(r)) for r in rows])
    return beam.advance(tokens, logprobs, stop)


def test_the_best_continuations_of_all_rows_make_the_next_beam() -> None:
    beam = SegmentBeam(2, EOT)
    assert _step(beam, [[(5, -0.1), (6, -0.5), (7, -2.0)]]) == [0, 0]
    assert [h.tokens for h in beam.live] == [(5,), (6,)]
    # row 1 ("6") continues better than row 0 ("5"): both new hypotheses grow from row 1's cache
    assert _step(beam, [[(8, -3.0)], [(9, -0.1), (10, -0.2)]]) == [1, 1]
    assert [h.tokens for h in beam.live] == [(6, 9), (6, 10)]
    assert beam.live[0].logprob == pytest.approx(-0.6)


def test_an_end_of_text_among_the_best_finishes_and_a_later_one_is_skipped() -> None:
    beam = SegmentBeam(2, EOT)
    _step(beam, [[(5, -0.1), (6, -0.2)]])
    # ranked: (5,EOT) -0.15 is within the first 2: finished; (6,EOT) at rank 3 is skipped
    _step(beam, [[(EOT, -0.05), (7, -0.3)], [(8, -0.1), (EOT, -0.9)]])
    assert beam.finished == [Hypothesis((5,), pytest.approx(-0.15))]
    assert [h.tokens for h in beam.live] == [(6, 8), (5, 7)]
    assert not beam.done
    _step(beam, [[(EOT, -0.1)], [(EOT, -0.1)]])
    assert beam.done and beam.live == []
    # per-token score: (5,) -0.15 / 1 beats (6, 8) -0.4 / 2
    assert beam.best().tokens == (5,)


def test_a_guarded_hypothesis_loses_to_one_that_ended_by_itself() -> None:
    beam = SegmentBeam(2, EOT)
    _step(beam, [[(5, -0.01), (6, -0.5)]])
    _step(beam, [[(5, -0.01), (EOT, -0.02)], [(EOT, -3.0)]], stop=lambda t: t == (5, 5))
    assert beam.done
    guarded = [h for h in beam.finished if h.guarded]
    assert [h.tokens for h in guarded] == [(5, 5)]
    assert beam.best() == Hypothesis((5,), pytest.approx(-0.03))
    with pytest.raises(ValueError, match="beam size"):
        SegmentBeam(0, EOT)


def _beam(recognizer: Recognizer, size: int, window_s: float = 0.0) -> Recognizer:
    options = replace(recognizer.decoder.options, beam_size=size, window=WindowPolicy(window_s),
                      full_window_retry=window_s > 0)
    return Recognizer(recognizer.model, options)


# Short utterances of the eval set on which beam 5 and greedy disagree (measured at d52781d: "for Queen of
# Cloves" / "Clothes", "Seven of clubs" / "7 of clubs", "Front, left" / "Front left"), and one on which they
# agree; `callqa bench check` (``beam-reference``) runs all 20.
BEAM_SLICE = ("cards/002", "cards/003", "alsa/Front_Left", "cards/001")


def test_beam_five_in_a_full_window_equals_faster_whispers_beam_five(eval_sets: dict[str, list[EvalUtterance]]) -> None:
    """Same weights, float32, 30 s windows, batched: the reference's text on every utterance."""
    chosen = [u for u in eval_sets["8k-mulaw"] if u.id in BEAM_SLICE]
    result = beam_reference_guard(chosen)
    print(result.as_json())
    assert result.figures["utterances"] == len(BEAM_SLICE)
    assert result.met, result.misses()  # the reference's text, and beam search really searched


@pytest.mark.slow
def test_beams_of_a_batch_decode_as_each_segment_alone(
    recognizer_fp32: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """In the default short windows, with retries: rows leave and regroup, texts do not depend on it."""
    utterances = eval_sets["8k-mulaw"][:8]
    ours = _beam(recognizer_fp32, 5, window_s=5.0)
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
    together = ours.recognize(segments)
    for segment, batched in zip(segments, together, strict=True):
        alone = ours.recognize([segment])[0]
        assert isinstance(batched, TranscriptResult) and isinstance(alone, TranscriptResult)
        assert (batched.text, batched.tokens) == (alone.text, alone.tokens)
        assert batched.avg_logprob == pytest.approx(alone.avg_logprob, abs=1e-4)


def test_short_windows_rank_by_summed_log_probability_and_distrust_a_phrase_said_twice() -> None:
    """Mostly-padding windows: per-token scores favoured "1 1" over "1" and "10 of clubs 10 of clubs"
    over "10 of clubs" (Asterisk WER 23.8 % at beam 5); the sum and the says-twice check do not."""
    from pipeline.asr.decoding import says_twice

    one, twice = Hypothesis((1,), -0.6), Hypothesis((1, 1), -0.9)
    assert twice.score(1.0) > one.score(1.0) and one.score(0.0) > twice.score(0.0)
    beam = SegmentBeam(2, EOT, length_penalty=0.0)
    beam.finished = [one, twice]
    assert beam.best() == one
    assert says_twice((5, 6, 7, 5, 6, 7)) and not says_twice((5, 6, 5, 6)) and not says_twice((5, 6, 7, 8, 5, 6, 7))
    per_token = SegmentBeam(2, EOT)
    per_token.finished = [Hypothesis((1, 2, 3), -0.9), Hypothesis((1, 2, 3, 1, 2, 3), -1.2)]
    assert per_token.best().tokens == (1, 2, 3, 1, 2, 3)
    assert per_token.best(lambda t: says_twice(t)).tokens == (1, 2, 3)
