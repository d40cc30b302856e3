"""The evaluation set read from the Debian packages."""

from __future__ import annotations

import numpy as np

from pipeline.audio.files import load_audio
from pipeline.eval.dataset import POCKETSPHINX_DATA, parse_sphinx_transcription


def test_twenty_recordings_and_117_words(eval_set) -> None:
    assert len(eval_set) == 20
    assert sum(u.word_count for u in eval_set) == 117
    assert len({u.id for u in eval_set}) == 20


def test_audio_is_16_khz_float_speech_of_the_source_length(eval_set) -> None:
    for utterance in eval_set:
        source = load_audio(utterance.source)
        assert utterance.audio.dtype == np.float32 and utterance.audio.ndim == 1
        assert abs(utterance.audio.size - source.samples.shape[1] * 16000 / source.sample_rate) <= 1
        assert 1.0 < utterance.duration_s < 8.0
        assert np.sqrt(np.mean(utterance.audio**2)) > 0.005, utterance.id


def test_references_come_from_transcripts_and_file_names(eval_set) -> None:
    by_id = {u.id: u for u in eval_set}
    assert by_id["cards/004"].reference == "five five"
    assert by_id["tidigits/dhd.2934z"].reference == "two nine three four zero"
    assert by_id["alsa/Front_Center"].reference == "front center"
    assert by_id["goforward"].reference == "go forward ten meters"
    assert not any(u.id.endswith("Noise") for u in eval_set)
    for utterance in eval_set:
        assert utterance.reference == utterance.reference.lower().strip()
        assert "<s>" not in utterance.reference


def test_licences_are_named(eval_set) -> None:
    assert {u.licence.split(" ")[0] for u in eval_set} == {"BSD-2-Clause", "GPL-2.0"}
    assert all(u.licence.startswith("GPL") == u.id.startswith("alsa/") for u in eval_set)


def test_sphinx_transcription_parser() -> None:
    parsed = parse_sphinx_transcription((POCKETSPHINX_DATA / "cards" / "cards.transcription").read_text())
    assert parsed["005"] == "eight of spades four of clubs seven of hearts"
    assert len(parsed) == 5
