"""The recording's cuts without Kafka: a check that still hears digits widens the cut to the whole turn, what counts
as clean, how cuts merge, and the two legs kept apart by the codec. The hidden-digit call on real speech is
tests/worker/test_recordings.py (through a worker) and `callqa bench recordings` (the library's PII calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.audio import codecs
from pipeline.config import get_settings
from pipeline.contracts.messages import JobCut, JobRedaction
from pipeline.recordings.cuts import Cut, is_clean, merged, place_cuts, silenced
from pipeline.recordings.encode import crosstalk_db, decode_call, encode_call
from tests.recordings.conftest import RATE


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
