"""The Asterisk core prompts as an evaluation set: real 8 kHz telephony recordings with the package's
transcripts, descriptions of sounds left out of the references and kept apart as non-speech."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.eval.dataset import (
    ASTERISK_SOUNDS,
    asterisk_non_speech,
    is_speech_transcript,
    load_asterisk_set,
    parse_asterisk_transcripts,
    spoken_words,
)


def test_transcript_lines_are_name_and_text() -> None:
    text = "; Core Asterisk Sounds in English\n\nauth-thankyou: Thank you.\ndigits/7:   seven \nbeep: [a beep tone]\n"
    assert parse_asterisk_transcripts(text) == {"auth-thankyou": "Thank you.", "digits/7": "seven",
                                                "beep": "[a beep tone]"}


@pytest.mark.parametrize(("text", "words", "speech"), [
    ("[this is a simple beep tone]", "", False),
    ("<beep ascending>", "", False),
    ("(1 second of silence)", "", False),
    ("press * to toggle pause, press # to exit", "press star to toggle pause, press pound to exit", True),
    ("At the tone [beep] the time will be", "At the tone the time will be", True),
])
def test_descriptions_of_sounds_are_not_words(text: str, words: str, speech: bool) -> None:
    assert spoken_words(text) == words
    assert is_speech_transcript(text) is speech


def test_the_set_is_the_package_s_spoken_prompts_at_16_khz() -> None:
    utterances = load_asterisk_set()
    assert len(utterances) >= 540  # 568 sounds less tones, beeps and silences
    assert 20 * 60 < sum(u.duration_s for u in utterances) < 30 * 60
    assert len({u.id for u in utterances}) == len(utterances)
    for u in utterances:
        assert u.reference and not any(c in u.reference for c in "[]<>()*#"), u
        assert u.audio.dtype.name == "float32" and u.audio.ndim == 1 and u.duration_s > 0.1, u.id
        assert Path(u.source).is_relative_to(ASTERISK_SOUNDS) and "CC-BY-SA" in u.licence
    by_id = {u.id: u.reference for u in utterances}
    assert by_id["asterisk/digits/7"] == "seven" and by_id["asterisk/auth-thankyou"] == "Thank you."


def test_tones_and_silences_are_the_non_speech_set() -> None:
    ids = {u.id for u in asterisk_non_speech()}
    assert {"asterisk/beep", "asterisk/silence/1", "asterisk/tt-monkeys"} <= ids
    assert not ids & {u.id for u in load_asterisk_set()}
    assert all(u.reference == "" for u in asterisk_non_speech())
