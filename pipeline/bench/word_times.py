"""When each word of the library's turns ends, by an independent aligner: faster-whisper's word timestamps
(cross-attention alignment) on the same 8 kHz μ-law audio the traffic sends, on the Whisper tiny.en weights
(``FasterWhisper.on_our_weights``). Whisper's word times are good to about a tenth of a second: enough to
time a word to the screen against a bound of 1.5 s, not to judge tens of milliseconds.

Computed for the turns a run uses and kept beside the built library (``word-times.json``, valid for its
manifest's digest), so a turn is aligned once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.bench.traffic import RATE, LibraryTurn, TurnLibrary
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.eval.wer import normalize_text

ALIGNER = "faster-whisper tiny.en word_timestamps"
CACHE_NAME = "word-times.json"


@dataclass(frozen=True)
class WordTime:
    """A normalised word of a turn and when it ends (ms from the turn's start)."""

    word: str
    end_ms: int


TurnKey = tuple[str, str, int]  # library call, leg, start_ms


def turn_key(turn: LibraryTurn) -> TurnKey:
    return (turn.call, str(turn.leg), turn.start_ms)


def library_word_times(library: TurnLibrary, turns: Iterable[LibraryTurn], console: Console,
                       folder: Path = LIBRARY_DIR, threads: int = 2) -> dict[TurnKey, tuple[WordTime, ...]]:
    """The words of ``turns`` (of ``library``) with their end times: from the cache where it holds them for
    this library, the others aligned now and added to it."""
    digest = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()[:16]
    cache = folder / CACHE_NAME
    known: dict[TurnKey, tuple[WordTime, ...]] = {}
    if cache.exists():
        doc = json.loads(cache.read_text())
        if doc.get("manifest") == digest and doc.get("aligner") == ALIGNER:
            known = {(c, leg, int(s)): tuple(WordTime(w, int(e)) for w, e in words) for c, leg, s, words in doc["turns"]}
    missing = list({turn_key(t): t for t in turns if turn_key(t) not in known}.values())
    if missing:
        known.update(_align(library, missing, console, threads))
        cache.write_text(json.dumps({"manifest": digest, "aligner": ALIGNER, "turns": [
            [c, leg, s, [[w.word, w.end_ms] for w in words]] for (c, leg, s), words in known.items()]}))
    return known


def _align(library: TurnLibrary, turns: list[LibraryTurn], console: Console,
           threads: int) -> dict[TurnKey, tuple[WordTime, ...]]:
    from faster_whisper import WhisperModel

    from pipeline.eval.systems import FasterWhisper

    model = WhisperModel(FasterWhisper.on_our_weights(threads).model_path, device="cpu", compute_type="int8",
                         cpu_threads=threads)
    out: dict[TurnKey, tuple[WordTime, ...]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("word times (faster-whisper)", total=len(turns))
        for turn in turns:
            audio = resample(codecs.decode(library.turn_audio(turn), "mulaw"), RATE, 16000)
            segments, _ = model.transcribe(audio, language="en", beam_size=1, word_timestamps=True,
                                           condition_on_previous_text=False, vad_filter=False)
            out[turn_key(turn)] = tuple(
                WordTime(token, round(1000 * word.end))
                for segment in segments for word in (segment.words or ())
                for token in normalize_text(word.word).split())  # "$5" -> "five dollars": both end with it
            progress.advance(task)
    return out


def words_of(times: Mapping[TurnKey, tuple[WordTime, ...]], turn: LibraryTurn) -> tuple[WordTime, ...]:
    return times.get(turn_key(turn), ())
