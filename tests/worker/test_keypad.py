"""Keypad tones through the worker's core, without Kafka (real front end, VAD, checkpoints and store; a fake
transcriber): a caller types a card number on the keypad, an agent a key too. The tones are silenced before
the segmenter hears them, never reach the recogniser, are cut from the kept recording, and the call's stored
results say how many there were and when, on which leg, and nothing of which keys. A leg checkpointed
anywhere, a tone under way included, resumes as the uninterrupted one; a checkpoint without the detector's
state (older workers) resumes without it. Expected times are written from how each leg is built."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.audio.dtmf import detect_tones
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent, PostCallJob
from pipeline.postcall.audio import assemble
from pipeline.qa.call import QaConfig
from pipeline.recordings.encode import decode_call
from pipeline.recordings.storage import RecordingStore
from pipeline.recordings.writer import CallRecorder
from pipeline.segmentation.segmenter import Silence, SpeechSegment
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.web.data import read_call_page
from pipeline.web.render import PageContext, ServerLinks, call_timeline, render_call_page
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoints import leg_checkpoint, leg_is_quiet, restore_leg
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription
from tests.audio.conftest import _ms, key_tone
from tests.web.conftest import StoreRows

RATE, FRAME = 8000, 160  # 20 ms of mu-law
SPEECH = Path("/usr/share/pocketsphinx/test/data/goforward.raw")  # "go forward ten meters", 2.8 s
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)
TOLERANCE_MS = 3
# The customer: speech at 0.5 s, then types 4111 1111 at 4.0 s (80 ms tones, 80 ms apart), speech again at
# 6.0 s. The agent: a key at 1.0 s (100 ms), then speech at 2.0 s. Both legs 9.5 s long.
CUSTOMER_KEYS = [(4000 + 160 * k, 4080 + 160 * k) for k in range(8)]
AGENT_KEYS = [(1000, 1100)]
LEG_MS = 9500


def _speech() -> np.ndarray:
    audio = load_audio(SPEECH)
    return resample(audio.mono(), audio.sample_rate, RATE)


def _leg(speech_at: Sequence[int], keys: Sequence[tuple[str, int, int]]) -> np.ndarray:
    leg = np.zeros(_ms(LEG_MS), np.float32)
    speech = _speech()
    for at in speech_at:
        leg[_ms(at): _ms(at) + speech.size] += speech
    for k, (key, start, end) in enumerate(keys):
        leg[_ms(start): _ms(end)] += key_tone(key, end - start, seed=k)
    return codecs.encode(leg, "mulaw")


def call_legs() -> dict[str, bytes]:
    return {
        "customer": _leg([500, 6000], [(key, a, b) for key, (a, b) in zip("41111111", CUSTOMER_KEYS, strict=True)]),
        "agent": _leg([2000], [("5", *AGENT_KEYS[0])]),
    }


def _close(found: Sequence[tuple[str, int, int]], put: Sequence[tuple[str, int, int]]) -> bool:
    return len(found) == len(put) and all(
        f[0] == p[0] and abs(f[1] - p[1]) <= TOLERANCE_MS and abs(f[2] - p[2]) <= TOLERANCE_MS
        for f, p in zip(found, put, strict=True))


EXPECTED = sorted([("agent", *AGENT_KEYS[0]), *(("customer", a, b) for a, b in CUSTOMER_KEYS)], key=lambda t: t[1])


class HeardTranscriber:
    """Keeps every segment's audio; says the same words for each (no digits: nothing is redacted)."""

    idle = False

    def __init__(self) -> None:
        self.heard: list[np.ndarray] = []

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        self.heard.append(audio_16k)
        await asyncio.sleep(0)
        return Transcription("go forward ten meters", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


class HeardFrontEnd(LegFrontEnd):
    """The worker's front end, keeping what it hands the segmenter (16 kHz; a skipped gap as its zeros)."""

    def __init__(self, sample_rate: int, encoding: str, settings: Settings) -> None:
        super().__init__(sample_rate, encoding, settings)
        self.heard: list[np.ndarray] = []

    def to_segmenter(self, samples: np.ndarray) -> np.ndarray:
        out = super().to_segmenter(samples)
        self.heard.append(out)
        return out

    def silence_to_segmenter(self, samples: int) -> list[np.ndarray | Silence]:
        pieces = super().silence_to_segmenter(samples)
        self.heard += [np.zeros(p.samples, np.float32) if isinstance(p, Silence) else p for p in pieces]
        return pieces


async def _run_call(legs: dict[str, bytes], settings: Settings) -> tuple[MemoryPorts, HeardTranscriber,
                                                                           dict[str, HeardFrontEnd], list[AudioFrame]]:
    ports, transcriber, front_ends = MemoryPorts(), HeardTranscriber(), {}

    def front_end(rate: int, encoding: str) -> LegFrontEnd:
        made = HeardFrontEnd(rate, encoding, settings)
        front_ends[f"leg{len(front_ends)}"] = made
        return made

    processor = CallProcessor(settings, transcriber, ports, ports, front_end,  # type: ignore[arg-type]
                              QaConfig.from_settings(settings))
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent", "customer"], tenant="acme"))
    n = len(legs["agent"]) // FRAME
    frames = [AudioFrame("c1", leg, seq, seq * 20, RATE, "mulaw", legs[leg][seq * FRAME:(seq + 1) * FRAME],  # type: ignore[arg-type]
                         produced_at_ms=seq * 20) for seq in range(n) for leg in ("agent", "customer")]
    for start in range(0, len(frames), 20):  # 10 frames (200 ms) of each leg at a time
        await processor.on_frames([(AUDIO_TP, start + i + 1, f) for i, f in enumerate(frames[start:start + 20])])
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))
    while processor.calls or any(c.pending for c in processor.awaiting_release):
        await asyncio.sleep(0.01)
    assert processor.failures == []
    # The legs' front ends were made as their first frames came: the agent's, then the customer's.
    return ports, transcriber, dict(zip(("agent", "customer"), front_ends.values(), strict=True)), frames


def test_keypad_tones_are_silenced_before_the_segmenter_stored_as_times_and_cut_from_the_recording(
        tmp_path: Path, chdb_path: str, unique_name: str) -> None:
    settings = Settings(topic_audio=AUDIO_TP[0], topic_call_events=EVENTS_TP[0], keypad_tones=True)
    legs = call_legs()
    ports, transcriber, front_ends, frames = asyncio.run(_run_call(legs, settings))

    # What reached each leg's segmenter (16 kHz): digital silence over every tone (and its 10 ms guards, less
    # the resampler's reach of 8 ms and the edge tolerance); the speech around it as loud as it was.
    for leg, put in (("customer", CUSTOMER_KEYS), ("agent", AGENT_KEYS)):
        heard = np.concatenate(front_ends[leg].heard)
        for a, b in put:
            assert not heard[(a - 10 + 8 + TOLERANCE_MS) * 16: (b + 10 - 8 - TOLERANCE_MS) * 16].any(), (leg, a)
        speech_at = 600 if leg == "customer" else 2100
        assert np.sqrt(np.mean(heard[speech_at * 16: (speech_at + 1500) * 16] ** 2)) > 0.01
    # The recogniser heard speech, never a tone.
    assert transcriber.heard and all(detect_tones(audio, 16000) == [] for audio in transcriber.heard)

    # The call's stored results: how many tones, when, on which leg; no key anywhere.
    [calls_row] = [row for table, row in ports.rows if table == "calls"]
    assert _close(calls_row["keypad"], EXPECTED) and len(calls_row["keypad"]) == 9
    [job] = [m for m in ports.messages if isinstance(m, PostCallJob)]
    assert _close([(t.leg, t.start_ms, t.end_ms) for t in job.keypad], EXPECTED)
    assert {tuple(vars(t)) for t in job.keypad} == {("leg", "start_ms", "end_ms")}

    # The kept recording, written from the call's frames as the post-call pass reads them: no tone in it.
    async def no_decode(segments: object) -> list[object]:
        raise AssertionError("nothing was redacted: no turn to check")

    store = RecordingStore(str(tmp_path / "recordings"))
    recorded = asyncio.run(CallRecorder(settings, no_decode, store).record(job, assemble(job, frames)))  # type: ignore[arg-type]
    assert sorted((c.leg, c.kind, c.how) for c in recorded.cuts) == sorted(
        [("agent", "KEYPAD", "measured")] + [("customer", "KEYPAD", "measured")] * 8)
    kept, rate = decode_call(store.read("c1"))
    for leg, put in (("customer", CUSTOMER_KEYS), ("agent", AGENT_KEYS)):
        channel = kept[leg]
        assert detect_tones(resample(channel, rate, RATE), RATE) == [], leg
        for a, b in put:
            assert np.sqrt(np.mean(channel[a * rate // 1000: b * rate // 1000] ** 2)) < 1e-3, (leg, a)
        speech_at = 600 if leg == "customer" else 2100
        assert np.sqrt(np.mean(channel[speech_at * rate // 1000: (speech_at + 1500) * rate // 1000] ** 2)) > 0.01

    # Stored in the embedded store and read back for the call page: nine keypad marks on their legs' lanes.
    client = connect(f"chdb://{chdb_path}", unique_name)
    try:
        migrate(client, unique_name)
        for table in ("calls", "call_qa"):
            [row] = [r for t, r in ports.rows if t == table]
            client.insert(table, [list(row.values())], column_names=list(row), database=unique_name)
        page = read_call_page(StoreRows(client, unique_name), unique_name, "c1")
        assert page is not None and _close(page.keypad, EXPECTED)
        timeline = call_timeline(page, 5_000)
        lanes = {lane.name: lane.y for lane in timeline.lanes}
        assert sorted((b.y, b.start_ms) for b in timeline.of_kind("keypad")) == sorted(
            (lanes[leg], a) for leg, a, _ in page.keypad)
        html = render_call_page(page, PageContext(ServerLinks()))
        assert html.count('data-kind="keypad"') == 9 and "keypad tones</span>9 (silenced)" in html
    finally:
        client.command(f"DROP DATABASE IF EXISTS {unique_name}")
        client.close()


def _segments(leg: LegState, frames: Sequence[tuple[int, bytes]], finish: int | None) -> list[tuple[int, int, str]]:
    closed: list[SpeechSegment] = [s for seq, payload in frames for audio in leg.take(seq, payload, seq * 20)
                                   for s in leg.front_end.segmenter.take(audio)]
    closed += [] if finish is None else leg.finish(finish)
    return [(s.start_ms, s.end_ms, f"{float(np.abs(s.audio).sum()):.3f}") for s in closed]


@pytest.mark.parametrize("detector_state", ["kept", "older record"])
def test_a_leg_checkpointed_anywhere_resumes_with_its_keypad_tones(detector_state: str) -> None:
    """Snapshots wherever the leg is quiet, while a tone is under way too: the resumed leg closes the same
    segments and knows the same tones. A record without the detector's state (a worker that had none wrote
    it) resumes with a fresh detector: the tones after it are found, the leg keeps its clock, nothing fails."""
    settings = Settings(keypad_tones=True)
    payload = call_legs()["customer"]
    frames = [(seq, payload[seq * FRAME:(seq + 1) * FRAME]) for seq in range(len(payload) // FRAME)]

    def open_leg(keypad_tones: bool = True) -> LegState:
        front_end = LegFrontEnd(RATE, "mulaw", settings.model_copy(update={"keypad_tones": keypad_tones}))
        return LegState.open("c1", "customer", front_end, 20, settings.max_segment_ms, settings.reorder_window_ms)

    whole = open_leg()
    reference = _segments(whole, frames, len(frames))
    assert _close([("customer", t.start_ms, t.end_ms) for t in whole.front_end.keypad_tones],
                  [("customer", a, b) for a, b in CUSTOMER_KEYS])
    under_way = resumed_count = 0
    # Every other frame while the keys are typed (4.0-5.3 s), every half second elsewhere.
    for at in sorted({*range(195, 270, 2), *range(5, len(frames) - 3, 25)}):
        first = open_leg(keypad_tones=detector_state == "kept")
        before = _segments(first, frames[:at], None)
        if not leg_is_quiet(first):
            continue
        checkpoint = leg_checkpoint(first)
        assert (checkpoint.keypad_released >= 0) == (detector_state == "kept")
        under_way += checkpoint.keypad_rescan < checkpoint.keypad_released + len(checkpoint.keypad_audio) // 4 - 205
        resumed = restore_leg(checkpoint, "c1", LegFrontEnd(RATE, "mulaw", settings), settings.max_segment_ms,
                              settings.reorder_window_ms)
        after = _segments(resumed, frames[at:], len(frames))
        tones = [(t.start_ms, t.end_ms) for t in resumed.front_end.keypad_tones]
        resumed_count += 1
        if detector_state == "kept":
            assert before + after == reference, f"checkpoint at frame {at}"
            assert tones == [(t.start_ms, t.end_ms) for t in whole.front_end.keypad_tones], at
        else:  # the tones wholly after the checkpoint are found; the leg keeps its clock
            later = [(a, b) for a, b in CUSTOMER_KEYS if a >= at * 20]
            assert all(any(abs(a - s) <= TOLERANCE_MS for s, _ in tones) for a, _ in later), at
            assert resumed.front_end.segmenter.samples_received == whole.front_end.segmenter.samples_received
    if detector_state == "kept":
        assert resumed_count >= 30 and under_way > 0
    else:  # without a detector the VAD takes the tones for speech: no checkpoint while they are typed
        assert resumed_count >= 10
