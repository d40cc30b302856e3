"""CallQA's ``holds``: when the call was on hold, not only for how long. A message of a
producer from before the field reads with no holds; a new one round-trips its intervals exactly."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.contracts import CallQA, Serde
from pipeline.contracts.messages import CallHold


def test_holds_round_trip_and_an_earlier_version_reads_as_none(written_before: Callable[..., bytes]) -> None:
    serde = Serde.from_settings()
    qa = CallQA("c", 80.0, False, {"hold_ms": 25_000.0}, [], [], computed_at_ms=5, hold_ms=25_000,
                holds=[CallHold(3_000, 23_000), CallHold(40_000, 45_000)])
    back = serde.decode_any(serde.encode(qa))
    assert back == qa and back.holds[1] == CallHold(40_000, 45_000)

    written = written_before(CallQA.SCHEMA, "holds", {
        "call_id": "c", "score_pct": 90.0, "auto_failed": False, "metrics": {}, "items": [], "events": [],
        "computed_at_ms": 5, "hold_ms": 20_000})
    old = serde.decode(written, CallQA)
    assert old.hold_ms == 20_000 and old.holds == []
