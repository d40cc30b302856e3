"""The worker's call core redacts a call the same whichever order its segments finish decoding.

Real audio (festival speech on two legs), the real front end (resampler, Silero VAD segmenter) and the
real ``CallProcessor``; only the transcriber is scripted, because what is under test is the order in
which decoding *finishes*, which the real batcher cannot be told. Outputs go to in-memory ports.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

pytestmark = pytest.mark.skipif(shutil.which("text2wave") is None, reason="festival is missing")

# (leg, what is said, what the scripted ASR "hears"): the CVV question is misheard.
TURNS = [
    ("agent", "Can I have the card number please?", "Can I have the card number please?"),
    ("customer", "four one one one, one one one one", "4111 1111"),
    ("customer", "one one one one, one one one one", "1111 1111"),
    ("agent", "And the security code on the back?", "And the three did you go on the back?"),
    ("customer", "the code is three two one", "the code is 321"),
]
EXPECTED = ["Can I have the card number please?", "[PAN]", "[PAN]", "And the three did you go on the back?",
            "the code is [CVV]"]  # fmt: skip
GAP_S = 1.2  # silence between turns: longer than the VAD's endpoint (0.5 s)


def _festival(text: str, folder: Path) -> np.ndarray:
    (folder / "t.txt").write_text(text + "\n")
    subprocess.run(["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)", str(folder / "t.txt"), "-o",
                    str(folder / "t.wav")], check=True, capture_output=True)  # fmt: skip
    with wave.open(str(folder / "t.wav")) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        return resample(pcm.astype(np.float32) / 32768, w.getframerate(), 8000)


@pytest.fixture(scope="module")
def legs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Two mu-law legs: each turn on its speaker's leg, silence on the other."""
    folder = tmp_path_factory.mktemp("speech")
    audio = {"agent": [np.zeros(8000, np.float32)], "customer": [np.zeros(8000, np.float32)]}
    for leg, said, _ in TURNS:
        speech = np.concatenate([_festival(said, folder), np.zeros(int(GAP_S * 8000), np.float32)])
        for name, parts in audio.items():
            parts.append(speech if name == leg else np.zeros_like(speech))
    return {name: codecs.encode(np.concatenate(parts), "mulaw") for name, parts in audio.items()}


class ScriptedTranscriber:
    """Returns the i-th submitted segment's scripted text once the test lets segment i finish."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.submitted = 0
        self.go = [asyncio.Event() for _ in texts]
        self.finished: list[int] = []

    idle = False  # no early decodes (pipeline/worker/early.py): each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        index = self.submitted
        self.submitted += 1
        await self.go[index].wait()
        self.finished.append(index)
        return Transcription(self.texts[index], -0.1, 0.0, 0.9, "scripted", 1, 1, 0.0, 0.0)


async def _settle() -> None:
    for _ in range(100):  # let every task that can run, run (no I/O is involved)
        await asyncio.sleep(0)


async def _run_call(legs: dict[str, bytes], finish_order: list[int]) -> tuple[list[str], list[int]]:
    settings = Settings()
    transcriber = ScriptedTranscriber([heard for _, _, heard in TURNS])
    recorder = MemoryPorts()
    processor = CallProcessor(settings, transcriber, recorder, recorder,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings),
                              QaConfig.from_settings(settings))  # fmt: skip
    tp = ("audio", 0)
    await processor.on_event(("events", 0), 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    frame = 160  # 20 ms of mu-law at 8 kHz
    frames = len(legs["agent"]) // frame
    for seq in range(frames):
        await processor.on_frames([
            (tp, 2 * seq + i, AudioFrame("c1", leg, seq, seq * 20, 8000, "mulaw",  # type: ignore[arg-type]
                                         legs[leg][seq * frame : (seq + 1) * frame]))
            for i, leg in enumerate(("agent", "customer"))
        ])  # fmt: skip
    await processor.on_event(("events", 0), 1, CallEvent("c1", "end", frame_counts={"agent": frames,
                                                                                   "customer": frames}))
    await _settle()
    assert transcriber.submitted == len(TURNS)  # the VAD found every turn
    for index in finish_order:
        transcriber.go[index].set()
        await _settle()
    async def finished() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(finished(), timeout=60)  # a call that never completes fails, not hangs
    finals = recorder.finals()
    return [m.text for m in sorted(finals, key=lambda m: m.start_ms)], transcriber.finished


async def test_stored_text_is_the_same_for_in_order_and_reversed_decoding(legs: dict[str, bytes]) -> None:
    in_order, finished = await _run_call(legs, [0, 1, 2, 3, 4])
    assert finished == [0, 1, 2, 3, 4] and in_order == EXPECTED
    # The answers finish before the questions that give them their context.
    reversed_texts, finished = await _run_call(legs, [4, 2, 1, 3, 0])
    assert finished == [4, 2, 1, 3, 0]
    assert reversed_texts == EXPECTED
