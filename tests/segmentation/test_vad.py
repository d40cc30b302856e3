"""Silero VAD on real speech: per-window probabilities, streaming and batching."""

from __future__ import annotations

import numpy as np

from pipeline.eval.speech_span import speech_span_ms
from pipeline.segmentation.vad import WINDOW, VadStream


def test_speech_scores_high_and_line_noise_low(vad, eval_set, line_noise) -> None:
    utterance = next(u for u in eval_set if u.id == "cards/005")
    start, end = speech_span_ms(utterance.audio, 16000)
    probs = vad.run([VadStream()], [np.concatenate([line_noise[:16000], utterance.audio])])[0]
    noise_probs = probs[: 16000 // WINDOW]
    speech_probs = probs[(16000 + start * 16) // WINDOW : (16000 + end * 16) // WINDOW]
    assert noise_probs.max() < 0.1
    assert np.median(speech_probs) > 0.9


def test_streaming_in_20_ms_chunks_scores_like_one_chunk(vad, eval_set) -> None:
    audio = eval_set[0].audio
    whole = vad.run([VadStream()], [audio])[0]
    stream = VadStream()
    pieces = [vad.run([stream], [audio[i : i + 320]])[0] for i in range(0, audio.size, 320)]
    assert whole.size == audio.size // WINDOW
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    assert stream.pending_samples == audio.size % WINDOW


def test_batch_across_legs_scores_like_each_leg_alone(vad, eval_set) -> None:
    audios = [u.audio for u in eval_set[:5]]  # different lengths: the batch shrinks as legs run out
    batched = vad.run([VadStream() for _ in audios], audios)
    for audio, probs in zip(audios, batched, strict=True):
        np.testing.assert_allclose(probs, vad.run([VadStream()], [audio])[0], atol=1e-4)


def test_state_is_carried_between_windows(vad, eval_set) -> None:
    audio = eval_set[5].audio[: 20 * WINDOW]
    carried = vad.run([VadStream()], [audio])[0]
    fresh = np.concatenate([vad.run([VadStream()], [audio[i : i + WINDOW]])[0] for i in range(0, audio.size, WINDOW)])
    assert np.abs(carried - fresh).max() > 0.05
