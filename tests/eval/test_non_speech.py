"""Non-speech on a call leg (hold music, tones, silences, line noise, breathing) must give no words: the
worker's path (μ-law leg -> VAD segmenter -> recogniser -> no-speech rule) measured on ~8 minutes of it."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.asr.engine import Engine
from pipeline.eval.non_speech import emitted_words, generated_noises, hold_music, non_speech_set


def test_generated_noises_are_reproducible_at_line_level() -> None:
    first, again = generated_noises(seconds=2.0), generated_noises(seconds=2.0)
    assert [u.id for u in first] == ["noise/white", "noise/pink", "noise/brown", "noise/mains-hum", "noise/breathing"]
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.audio, b.audio) and a.reference == ""
        rms_dbfs = 20 * np.log10(np.sqrt(np.mean(a.audio.astype(np.float64) ** 2)))
        assert rms_dbfs == pytest.approx(-30.0, abs=0.1), a.id


def test_hold_music_is_the_package_s_tracks_cut_to_length() -> None:
    tracks = hold_music(max_s=5.0)
    assert len(tracks) == 5 and all(u.duration_s == pytest.approx(5.0) for u in tracks)
    assert all(u.id.startswith("hold-music/") and "CC-BY-SA" in u.licence for u in tracks)


@pytest.mark.slow
def test_no_words_on_non_speech_through_the_worker_path() -> None:
    results = emitted_words(Engine.load(), non_speech_set(music_s=60.0))
    for r in results:
        print(f"{r.id:40s} {r.seconds:6.1f} s  segments {r.segments:2d}  words {r.words}  {r.texts}")
    assert sum(r.seconds for r in results) > 400
    assert {r.id.split("/")[0] for r in results} == {"asterisk", "hold-music", "alsa", "noise"}
    emitted = {r.id: r.texts for r in results if r.words}
    assert not emitted, f"words on non-speech: {emitted}"
