"""The recording's cuts on real speech, without Kafka: the live model's transcript redacts, its spans are placed by
character share, checked by decoding the cut audio again and widened where they leak; the Ogg/Opus recording,
transcribed again, holds none of the hidden-digit call's PII and still holds the rest of it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from pipeline.asr.engine import Engine
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.audio import codecs
from pipeline.config import get_settings
from pipeline.contracts.messages import JobCut, JobRedaction
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.recordings.cuts import Cut, is_clean, merged, place_cuts, silenced
from pipeline.recordings.encode import crosstalk_db, decode_call, encode_call
from tests.recordings.conftest import KEPT, RATE, leaks

pytestmark = pytest.mark.slow


def _transcript(engine: Engine, legs: dict[str, np.ndarray]) -> list[tuple[str, int, int, str]]:
    """(leg, start_ms, end_ms, text) of every segment of both legs, in time order."""
    out = []
    for leg, samples in legs.items():
        segments = engine.leg_segments(samples, RATE)
        out += [(leg, s.start_ms, s.end_ms, r.text) for s, r in zip(segments, engine.transcribe_segments(
            segments, keep_silence=True), strict=True)]
    return sorted(out, key=lambda t: (t[1], t[0] != "agent"))


def test_recording_of_the_hidden_digit_call_holds_no_pii_and_the_rest(hidden_call) -> None:
    engine = Engine.load(settings=get_settings())
    legs = {leg: codecs.decode(data, "mulaw") for leg, data in hidden_call.encoded.items()}  # as the worker hears
    analyzer = CallAnalyzer("hidden", QaConfig.from_settings(get_settings()))
    spoken = _transcript(engine, legs)
    stored = [analyzer.process(Segment("hidden", leg, f"{leg}-{a}", a, b, text)).redacted.text  # type: ignore[arg-type]
              for leg, a, b, text in spoken]
    assert not leaks(" ".join(stored)), stored  # the transcript first: what it redacts is what is cut
    turns = [JobRedaction(t.leg, t.start_ms, t.end_ms, t.digits_kept, [JobCut(*c) for c in t.cuts])
             for t in analyzer.redacted_turns]
    assert {c.kind for t in turns for c in t.cuts} >= {"PAN", "CVV", "DOB", "ADDRESS"}  # the expiry: a PAN chunk

    async def decode(segments: Sequence[AudioSegment]) -> list[TranscriptResult | Exception]:
        return engine.recognizer.recognize(segments)

    settings = get_settings()
    cuts = asyncio.run(place_cuts(turns, {leg: (x, RATE) for leg, x in legs.items()}, decode,
                                  settings.recordings_cut_margin_ms, settings.asr_lead_ms))
    kept = {leg: silenced(x, RATE, [(c.start_ms, c.end_ms, c.kind) for c in cuts if c.leg == leg])
            for leg, x in legs.items()}
    heard, rate = decode_call(encode_call(kept, RATE, settings.recordings_compression))
    assert rate == RATE and set(heard) == {"agent", "customer"}
    again = " ".join(text for *_, text in _transcript(engine, heard)).lower()
    assert leaks(again) == [], again
    assert [k for k in KEPT if k not in again] == [], again
    # Each cut lies on a turn whose text was redacted, and silences less than that turn's audio plus its lead.
    by_leg = {(t.leg, t.start_ms): t for t in turns}
    assert all(any(t.leg == c.leg and t.start_ms - 400 <= c.start_ms and c.end_ms <= t.end_ms for t in turns)
               for c in cuts), (cuts, by_leg)
    print("\ncuts:", [(c.leg, c.start_ms, c.end_ms, c.kind, c.how) for c in cuts])


def test_a_check_that_hears_digits_widens_the_cut_to_the_whole_turn() -> None:
    """A decoder that still hears the card at every step but the last: the cut ends as the whole segment."""
    turn = JobRedaction("customer", 1000, 5000, 0, [JobCut(2000, 3000, "PAN")])
    heard: list[int] = []

    async def decode(segments: Sequence[AudioSegment]) -> list[TranscriptResult | Exception]:
        heard.append(len(segments))
        return [TranscriptResult(s.start_ms, s.end_ms, "it is 4111 1111 1111 1111", 0.0, 0.0, "m", 1) for s in segments]

    legs = {"customer": (np.ones(6 * RATE, dtype=np.float32), RATE)}
    [cut] = asyncio.run(place_cuts([turn], legs, decode, margin_ms=300, lead_ms=200))
    assert (cut.start_ms, cut.end_ms, cut.how, heard) == (800, 5000, "segment", [1, 1])
    out = silenced(legs["customer"][0], RATE, [(cut.start_ms, cut.end_ms, cut.kind)])
    assert out[: 800 * 8].all() and not out[800 * 8: 5000 * 8].any() and out[5000 * 8:].all()


def test_clean_text_and_merging() -> None:
    assert is_clean("the code is [CVV] thank you", 0)
    assert not is_clean("the code is three two one", 0)  # heard as digits: a leak whatever the context
    assert not is_clean("it was 42 and then", 0) and is_clean("it was 42 and then", 2)  # digits it kept: fine
    assert not is_clean("I live at 12 Oak Street", 2)  # an address, whatever digits were kept
    a = Cut("customer", 100, 500, "PAN", "estimate")
    b = Cut("customer", 400, 900, "EXPIRY", "widened")
    c = Cut("agent", 450, 600, "DOB", "estimate")
    assert merged([b, c, a]) == [c, Cut("customer", 100, 900, "PAN,EXPIRY", "widened")]


def test_the_recording_keeps_each_leg_on_its_own_channel(hidden_call) -> None:
    """At the default compression the two legs stay apart (at 1.0 Opus folds them into one: both legs everywhere)."""
    legs = {leg: codecs.decode(data, "mulaw")[: 30 * RATE] for leg, data in hidden_call.encoded.items()}
    level = get_settings().recordings_compression
    heard, rate = decode_call(encode_call(legs, RATE, level))
    assert crosstalk_db(legs, heard, rate) < -25
    assert crosstalk_db(legs, *decode_call(encode_call(legs, RATE, 1.0))) > -10  # the fold this guards against
