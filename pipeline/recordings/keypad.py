"""Keypad tones in a call's recording: every tone silenced, and the silenced legs checked to hold none.

The worker found the tones live and silenced them before its VAD (pipeline/audio/dtmf.py); the job lists them
(``PostCallJob.keypad``). The recording is made from the audio topic, which still has them, so they are cut
here too. The detector is run again over each whole leg as well: a tone a worker restart cut in two is missed
live (the detector's state is checkpointed, but an older checkpoint may lack it), and the recording must not
keep it. The check is the attack a listener with a DTMF decoder would make: the leg with the cuts silenced
is searched again, and what is still found is cut too, wider each round; no tone is ever left in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.audio.dtmf import GUARD_MS, ToneSpan, detect_tones, silence_tones
from pipeline.contracts.messages import JobKeypadTone
from pipeline.recordings.cuts import Cut

KIND = "KEYPAD"
# The ``how`` of a keypad cut: where the detector measured the tone (with GUARD_MS either side), or, when a
# check still found one, that much wider.
MEASURED, WIDENED = "measured", "widened"
CHECKS = 3
WIDEN_MS = 100


def keypad_cuts(tones: Sequence[JobKeypadTone], legs: dict[str, tuple[np.ndarray, int]]) -> list[Cut]:
    """The cuts of the call's keypad tones: the job's ``tones`` and any found again in ``legs`` (each leg's
    samples and rate), checked until the legs with them silenced hold no tone. CPU work of ~1 ms per second of
    a leg: callers off the event loop run it on their executor."""
    cuts: list[Cut] = []
    for leg, (samples, rate) in legs.items():
        spans = [ToneSpan(t.start_ms, t.end_ms) for t in tones if t.leg == leg] + detect_tones(samples, rate)
        how = {span: MEASURED for span in spans}
        for round_ in range(CHECKS):
            left = detect_tones(silence_tones(samples, rate, list(how)), rate)
            if not left:
                break
            widen = 0 if round_ == 0 else WIDEN_MS * round_
            for span in left:
                how[ToneSpan(max(0, span.start_ms - widen), span.end_ms + widen)] = MEASURED if widen == 0 else WIDENED
        cuts += _merged([Cut(leg, max(0, s.start_ms - GUARD_MS), s.end_ms + GUARD_MS, KIND, h)
                         for s, h in how.items()])
    return cuts


def _merged(cuts: list[Cut]) -> list[Cut]:
    """One leg's overlapping keypad cuts as one, in order (widened if any part was)."""
    out: list[Cut] = []
    for cut in sorted(cuts, key=lambda c: (c.start_ms, c.end_ms)):
        last = out[-1] if out else None
        if last is not None and cut.start_ms <= last.end_ms:
            how = WIDENED if WIDENED in (last.how, cut.how) else MEASURED
            out[-1] = Cut(cut.leg, last.start_ms, max(last.end_ms, cut.end_ms), KIND, how)
        else:
            out.append(cut)
    return out
