"""Where a call's recording is cut: each redacted span's estimated place, widened until it is checked clean.

The transcript knows which characters it redacted, not when they were said (Moonshine gives no word times).
``RedactedText.time_spans`` places a span by its share of the segment's characters; speech is not spoken at
an even rate, so the cut starts ``margin_ms`` wider on each side and is then checked the way a listener with
a recogniser would attack it: the segment's audio with the cuts silenced is decoded again by the live model,
and the text must show no PII (the redactor with every context open) and no more digits than the redacted
transcript kept. A turn that fails is cut wider (three margins), and at last whole: no span is ever left in
because its estimate was off. ``Cut.how`` says which step held, which `callqa bench recordings` counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.audio.resample import resample
from pipeline.contracts.messages import JobRedaction
from pipeline.qa.numbers import digit_runs
from pipeline.qa.redaction import CallRedactor
from pipeline.qa.segment import Segment

ASR_RATE = 16000
# The steps a turn's cut goes through: the estimate with one margin, with three, then the whole segment.
STEPS = ("estimate", "widened", "segment")
# The live model on 16 kHz segments, one slot per segment (its text, or the exception it raised).
Decode = Callable[[Sequence[AudioSegment]], Awaitable[Sequence[TranscriptResult | BaseException]]]


@dataclass(frozen=True)
class Cut:
    """A stretch of one leg replaced by silence in the recording (ms on the leg's clock)."""

    leg: str
    start_ms: int
    end_ms: int
    kind: str  # the marker(s) of what it hides: PAN, CVV, ... ("PAN,EXPIRY" when merged)
    how: str  # estimate | widened | segment (STEPS)


def spans_at(turn: JobRedaction, step: int, margin_ms: int, lead_ms: int) -> list[tuple[int, int, str]]:
    """The turn's cuts at ``step``: its estimates ± one margin (0), ± three (1), or its whole audio (2)."""
    first = max(0, turn.start_ms - lead_ms)
    if step >= len(STEPS) - 1:
        return [(first, turn.end_ms, ",".join(dict.fromkeys(c.kind for c in turn.cuts)))]
    m = margin_ms * (1 if step == 0 else 3)
    return [(max(first, c.start_ms - m), min(turn.end_ms, c.end_ms + m), c.kind) for c in turn.cuts]


def silenced(samples: np.ndarray, rate: int, spans: Sequence[tuple[int, int, str]]) -> np.ndarray:
    """A copy of ``samples`` (a leg from its start) with ``spans`` (ms) set to zero."""
    out = np.array(samples, dtype=np.float32, copy=True)
    for start_ms, end_ms, _ in spans:
        out[max(0, start_ms * rate // 1000): max(0, end_ms * rate // 1000)] = 0.0
    return out


def is_clean(text: str, digits_kept: int) -> bool:
    """Whether decoded text shows nothing the redactor hides by its shape (an address, an e-mail, a card) and
    no more digits than the redacted transcript kept. The digit count stands for the numbers a context would
    redact: with every exchange taken as open the redactor hides every number, even one the transcript kept."""
    found = CallRedactor().redact(Segment("check", "customer", "check", 0, 0, text), remember=False)
    digits = sum(len(run.digits) for run in digit_runs(text)[1])
    return found.total == 0 and digits <= digits_kept


async def place_cuts(turns: Sequence[JobRedaction], legs: dict[str, tuple[np.ndarray, int]], decode: Decode,
               margin_ms: int, lead_ms: int) -> list[Cut]:
    """The cuts of a call's recording: every redacted turn cut at the first step its check passes.
    ``legs``: each leg's samples and rate; ``decode``: the live model on 16 kHz segments."""
    chosen: dict[int, int] = {}
    pending = [i for i, t in enumerate(turns) if t.leg in legs]
    for step in range(len(STEPS) - 1):
        if not pending:
            break
        checks = [_check_audio(turns[i], legs[turns[i].leg], spans_at(turns[i], step, margin_ms, lead_ms), lead_ms)
                  for i in pending]
        results = await decode(checks)
        failed = []
        for i, result in zip(pending, results, strict=True):
            if isinstance(result, TranscriptResult) and is_clean(result.text, turns[i].digits_kept):
                chosen[i] = step
            else:  # leaks, or could not be decoded: cut wider
                failed.append(i)
        pending = failed
    for i in pending:
        chosen[i] = len(STEPS) - 1
    cuts = [Cut(turns[i].leg, a, b, kind, STEPS[step])
            for i, step in sorted(chosen.items()) for a, b, kind in spans_at(turns[i], step, margin_ms, lead_ms)]
    return merged(cuts)


def _check_audio(turn: JobRedaction, leg: tuple[np.ndarray, int], spans: list[tuple[int, int, str]],
                 lead_ms: int) -> AudioSegment:
    """The turn's audio as the live model heard it (from ``lead_ms`` before its start), cuts silenced."""
    samples, rate = leg
    first = max(0, turn.start_ms - lead_ms)
    part = silenced(samples[first * rate // 1000: turn.end_ms * rate // 1000], rate,
                    [(a - first, b - first, kind) for a, b, kind in spans])
    return AudioSegment(first, turn.end_ms, resample(part, rate, ASR_RATE))


def merged(cuts: Sequence[Cut]) -> list[Cut]:
    """Overlapping cuts of a leg as one (kinds joined, the widest step kept), in order."""
    out: list[Cut] = []
    for cut in sorted(cuts, key=lambda c: (c.leg, c.start_ms)):
        last = out[-1] if out else None
        if last is not None and last.leg == cut.leg and cut.start_ms <= last.end_ms:
            kinds = ",".join(dict.fromkeys([*last.kind.split(","), *cut.kind.split(",")]))
            how = STEPS[max(STEPS.index(last.how), STEPS.index(cut.how))]
            out[-1] = Cut(cut.leg, last.start_ms, max(last.end_ms, cut.end_ms), kinds, how)
        else:
            out.append(cut)
    return out
