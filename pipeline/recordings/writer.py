"""A finished call's redacted recording: its legs read back (pipeline/postcall/audio.py), its redacted turns
cut (cuts.py) and its keypad tones (keypad.py), encoded (encode.py), put where recordings are kept
(storage.py), and described by a row of the ``recordings`` table, which is how pages, the API and erasure
find it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.config import Settings
from pipeline.contracts.messages import PostCallJob
from pipeline.postcall.audio import CallAudio
from pipeline.recordings.cuts import Cut, Decode, place_cuts, silenced
from pipeline.recordings.encode import CHANNELS, MEDIA_TYPE, RecordingError, encode_call
from pipeline.recordings.keypad import keypad_cuts
from pipeline.recordings.storage import RecordingStore
from pipeline.worker.outputs import to_datetime


@dataclass(frozen=True)
class RecordedCall:
    call_id: str
    url: str
    size: int  # bytes
    duration_ms: int
    cuts: tuple[Cut, ...]

    def row(self, job: PostCallJob) -> dict[str, Any]:
        """Its ``recordings`` row; times from the job, so a job done twice writes an equal row."""
        return {
            "call_id": self.call_id, "tenant": job.tenant, "url": self.url, "media_type": MEDIA_TYPE,
            "bytes": self.size, "duration_ms": self.duration_ms, "channels": list(CHANNELS),
            "cuts": [(c.leg, c.start_ms, c.end_ms, c.kind, c.how) for c in self.cuts],
            "started_at": to_datetime(job.started_at_ms), "written_at": to_datetime(job.requested_at_ms),
        }


class CallRecorder:
    """Writes finished calls' recordings (``record``); the decoding that checks the cuts is the caller's."""

    def __init__(self, settings: Settings, decode: Decode, store: RecordingStore | None = None) -> None:
        self.settings = settings
        self.decode = decode
        self.store = store or RecordingStore(settings.recordings_location)

    async def record(self, job: PostCallJob, audio: CallAudio, executor: Executor | None = None) -> RecordedCall:
        """The call's recording, written; the encoding and the write run on ``executor`` (the post-call pass's
        niced thread), off the event loop the live work shares."""
        legs: dict[str, tuple[np.ndarray, int]] = {leg: (a.samples, a.sample_rate) for leg, a in audio.legs.items()}
        rates = {rate for _, rate in legs.values()}
        if len(rates) != 1:
            raise RecordingError(f"call {job.call_id}: its legs' rates differ ({sorted(rates)} Hz)")
        [rate] = rates
        loop = asyncio.get_running_loop()
        # Always, whatever keypad_tones says of the live path: found on the whole legs once per call, it is
        # cheap, and a recording must not keep a card typed on the keypad.
        keypad = await loop.run_in_executor(executor, keypad_cuts, job.keypad, legs)
        # The redacted turns are checked on the legs as they are kept: keypad tones silenced already.
        heard = {leg: (silenced(samples, r, [(c.start_ms, c.end_ms, c.kind) for c in keypad if c.leg == leg]), r)
                 for leg, (samples, r) in legs.items()} if keypad else legs
        cuts = await place_cuts(job.redacted, heard, self.decode, self.settings.recordings_cut_margin_ms,
                                self.settings.asr_lead_ms)
        cuts = sorted([*cuts, *keypad], key=lambda c: (c.leg, c.start_ms))
        url, size, n = await loop.run_in_executor(executor, self._write, job.call_id, legs, rate, cuts)
        return RecordedCall(job.call_id, url, size, n * 1000 // rate, tuple(cuts))

    def _write(self, call_id: str, legs: dict[str, tuple[np.ndarray, int]], rate: int,
               cuts: list[Cut]) -> tuple[str, int, int]:
        """Silence, encode and put the recording: (its URL, bytes, samples per leg)."""
        kept = {leg: silenced(samples, rate, [(c.start_ms, c.end_ms, c.kind) for c in cuts if c.leg == leg])
                for leg, (samples, _) in legs.items()}
        data = encode_call(kept, rate, self.settings.recordings_compression)
        return self.store.put(call_id, data), len(data), max((len(x) for x in kept.values()), default=0)


def cut_seconds(cuts: Sequence[Cut]) -> float:
    return sum(c.end_ms - c.start_ms for c in cuts) / 1000
