"""Keypad tones in the kept recording, without Kafka: the tones the worker listed are cut, a tone it missed (a
restart cut it in two) is found again and cut too, and the cut legs are checked to hold no tone. Times are
written from where the tones were put: each cut is the tone and 10 ms either side."""

from __future__ import annotations

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.dtmf import detect_tones
from pipeline.contracts.messages import JobKeypadTone
from pipeline.recordings.cuts import silenced
from pipeline.recordings.keypad import keypad_cuts
from tests.audio.conftest import _ms, key_tone

RATE = 8000


def _leg(tones: list[tuple[str, int, int]], ms: int = 3000) -> np.ndarray:
    leg = np.random.default_rng(5).normal(0, 0.002, _ms(ms)).astype(np.float32)  # line noise
    for k, (key, start, end) in enumerate(tones):
        leg[_ms(start): _ms(end)] += key_tone(key, end - start, seed=k)
    return codecs.decode(codecs.encode(leg, "alaw"), "alaw")


def test_the_listed_tones_and_one_missed_live_are_cut_and_the_cut_legs_hold_none() -> None:
    customer = _leg([("7", 300, 380), ("8", 500, 580), ("9", 700, 780)])
    agent = _leg([("#", 1200, 1300)])
    listed = [JobKeypadTone("customer", 300, 380), JobKeypadTone("customer", 700, 780)]  # 500-580 missed live
    cuts = keypad_cuts(listed, {"customer": (customer, RATE), "agent": (agent, RATE)})
    assert [(c.leg, c.kind, c.how) for c in cuts] == [("customer", "KEYPAD", "measured")] * 3 + [
        ("agent", "KEYPAD", "measured")]
    expected = [("customer", 290, 390), ("customer", 490, 590), ("customer", 690, 790), ("agent", 1190, 1310)]
    assert all(c.leg == leg and abs(c.start_ms - a) <= 3 and abs(c.end_ms - b) <= 3
               for c, (leg, a, b) in zip(cuts, expected, strict=True))
    for leg, samples in (("customer", customer), ("agent", agent)):
        kept = silenced(samples, RATE, [(c.start_ms, c.end_ms, c.kind) for c in cuts if c.leg == leg])
        assert detect_tones(kept, RATE) == []


def test_a_leg_without_tones_has_no_keypad_cut() -> None:
    assert keypad_cuts([], {"agent": (_leg([]), RATE)}) == []
