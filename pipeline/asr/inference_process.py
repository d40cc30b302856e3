"""Batches decoded in child processes, so the decode loop's Python does not share the worker's GIL.

The greedy / beam loop of ``decoding.py`` runs in Python between ONNX Runtime calls: in the worker's
inference thread it holds the GIL the event loop needs, so a second inference thread lost.
Here each of ``CALLQA_INFERENCE_PROCESSES`` child processes (multiprocessing ``spawn``: the worker has
threads, so no fork) loads and checks the same model folder once (sha256s, signature, canary: what
``Engine.load`` checks in-process) and decodes whole batches with an ordinary ``Recognizer``. The worker's
inference thread writes the batch's float32 audio into a shared-memory block of that child (one block per
child, reused and grown, so no audio is pickled), sends the rows' times, waits, wide flag and prompt tokens
over a pipe, and then only waits on the pipe (no GIL held) while each row's ``TranscriptResult`` (or
exception) comes back as soon as it is final, so the batcher's ``settle_soon`` still fires row by row. With N processes the batcher runs N batches at once.

- ``ProcessRecognizer``: the ``Recognizer`` contract (``recognize``, ``name``, ``version``, ``window``)
  over the children, which hold the model in use; the worker's process loads no copy of its own.
- ``ProcessBatcher``: a ``SegmentBatcher`` that closes the children on ``close()`` and, on a hot
  ``reload``, starts a new set of children on the new version (each checks it) and retires the old set
  once its running batches end.
- A child that dies (killed, out of memory) fails the rows of its batch it had not yet answered with
  ``InferenceProcessError`` naming its pid and exit code (the batcher hands each segment its error; no
  wait hangs), and a new child starts for the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import pickle
import queue
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.asr.batcher import SegmentBatcher, check_newer
from pipeline.asr.canary import load_checked
from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.manifest import Manifest, ModelIntegrityError
from pipeline.asr.recognizer import Recognizer, SegmentOutcome, checked_audio
from pipeline.asr.results import AudioSegment, SegmentAudio, TranscriptResult
from pipeline.config.asr import AsrSettings

log = logging.getLogger("callqa.asr")

INITIAL_BLOCK_BYTES = 16 * 10 * 16000 * 4  # 16 rows of 10 s at 16 kHz; grown when a batch needs more
READY_TIMEOUT_S = 300.0  # loading a model folder (sha256s of every graph, sessions) in a child
POLL_S = 0.5  # how often a waiting inference thread looks whether its child still lives
STOP_TIMEOUT_S = 5.0


class InferenceProcessError(RuntimeError):
    """The child process decoding a batch ended (or could not start) before it answered a row."""


@dataclass(frozen=True)
class _Row:
    start_ms: int
    end_ms: int
    offset: int  # in float32 samples, into the child's shared block
    samples: int


def asr_settings(settings: AsrSettings) -> AsrSettings:
    """Only the ASR fields (a worker's Settings also holds broker and store credentials): what a child gets."""
    return AsrSettings.model_validate({name: getattr(settings, name) for name in AsrSettings.model_fields})


class _Child:
    """One child process, its pipe and its shared audio block. Used by one inference thread at a time."""

    def __init__(self, folder: Path, settings: AsrSettings, number: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # the worker runs threads (faust, Kafka, ONNX Runtime)
        self.folder = folder
        self.number = number
        self.conn, theirs = ctx.Pipe(duplex=True)
        self.block = SharedMemory(create=True, size=INITIAL_BLOCK_BYTES)
        self._unlink = weakref.finalize(self, _release_block, self.block)
        self.process: BaseProcess = ctx.Process(
            target=serve, args=(theirs, str(folder), settings, number), name=f"asr-process-{number}", daemon=True,
        )
        self.process.start()
        theirs.close()  # ours closed: the child's death is EOF on our end
        self._ready = False
        self.busy = False  # a batch was sent and not all of it answered
        self.dead: InferenceProcessError | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the child has loaded the model; raise what stopped it (its own exception, e.g. a
        ModelIntegrityError, or InferenceProcessError)."""
        if self._ready:
            return
        if self.dead is not None:
            raise self.dead
        try:
            if not self._poll(timeout_s):
                raise self._died(f"did not load {self.folder} within {timeout_s:.0f} s")
            kind, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died("ended while loading the model") from exc
        if kind != "ready":
            self.dead = InferenceProcessError(f"inference process {self.pid} could not load {self.folder}")
            self.stop()
            raise payload
        self._ready = True

    def _poll(self, timeout_s: float) -> bool:
        """Wait for a message up to ``timeout_s``; False when none came. Raises EOFError if the child died."""
        waited = 0.0
        while waited < timeout_s:
            if self.conn.poll(POLL_S):
                return True
            waited += POLL_S
            if not self.process.is_alive() and not self.conn.poll(0):
                raise EOFError
        return False

    def _died(self, what: str) -> InferenceProcessError:
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        how = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        self.dead = InferenceProcessError(f"inference process {self.pid} ({how}) {what}")
        self.stop()
        return self.dead

    def run(
        self,
        rows: list[tuple[int, SegmentAudio, np.ndarray]],
        waits: Sequence[float],
        wide: bool,
        tell: SegmentOutcome,
        contexts: Sequence[Sequence[int]] | None,
    ) -> None:
        """Decode ``rows`` (slot index, segment, checked float32 audio) in the child; ``tell`` hears each
        slot's outcome once. If the child dies, the rows it had not answered get InferenceProcessError."""
        self.wait_ready()
        total = sum(audio.size for _, _, audio in rows) * 4
        if total > self.block.size:
            self._grow(total)
        shared = np.ndarray((self.block.size // 4,), dtype=np.float32, buffer=self.block.buf)
        specs: list[_Row] = []
        offset = 0
        for _, segment, audio in rows:
            shared[offset : offset + audio.size] = audio
            specs.append(_Row(segment.start_ms, segment.end_ms, offset, audio.size))
            offset += audio.size
        del shared  # no view left on the block: it may be closed when it grows
        picked = [contexts[i] for i, _, _ in rows] if contexts is not None else None
        answered: set[int] = set()
        try:
            self.conn.send(("batch", self.block.name, specs, [waits[i] for i, _, _ in rows], wide, picked))
            self.busy = True
            while True:
                if not self._poll(float("inf")):
                    continue
                kind, *rest = self.conn.recv()
                if kind == "done":
                    self.busy = False
                    return
                row, outcome = rest
                answered.add(row)
                tell(rows[row][0], outcome)
        except (EOFError, OSError) as exc:
            self.busy = False
            error = self._died(f"ended while decoding a batch of {len(rows)} segments")
            error.__cause__ = exc
            for row, (i, _, _) in enumerate(rows):
                if row not in answered:
                    tell(i, error)

    def _grow(self, needed: int) -> None:
        _release_block(self.block)
        self._unlink.detach()
        self.block = SharedMemory(create=True, size=max(needed, 2 * self.block.size))
        self._unlink = weakref.finalize(self, _release_block, self.block)

    def stop(self) -> None:
        """Ask the child to exit, then make sure it has; release the pipe and the block."""
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(("stop",))
            self.process.join(STOP_TIMEOUT_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(STOP_TIMEOUT_S)
        with contextlib.suppress(OSError):
            self.conn.close()
        self._unlink()


def _release_block(block: SharedMemory) -> None:
    with contextlib.suppress(OSError, BufferError):
        block.close()
    with contextlib.suppress(OSError):
        block.unlink()


class ProcessRecognizer(Recognizer):
    """``Recognizer.recognize`` run by one of ``processes`` children, each loaded from ``folder``.

    ``local`` is the same version already loaded (and checked) in this process, if the caller has one.
    Without it this process holds no model: each child checks the folder as ``Engine.load`` would (sha256s,
    signature and the canary), and a model is loaded here only if ``model``, ``decoder`` or a batch that
    reached no child needs one (a hot swap retired the children while it was on its way). A worker so
    starts about a second sooner on one core (one load and canary, not two) and holds one copy of the
    weights, not two. Up to ``processes`` batches run at once; a further ``recognize`` waits for a free child.
    """

    def __init__(self, folder: Path, settings: AsrSettings, processes: int, local: Recognizer | None = None) -> None:
        # Not Recognizer.__init__: the decoding happens in the children.
        self.manifest = Manifest.read(folder)
        self.processes = max(1, processes)
        self._settings = asr_settings(settings)
        self._folder = Path(folder)
        self._local = local
        self._local_lock = threading.Lock()
        self._lock = threading.Lock()
        self._running = 0
        self._retired = False
        self._closed = False
        # Checked here already: the children skip the canary (the sha256s and signature they check anyway).
        child_settings = (self._settings.model_copy(update={"model_canary": False}) if local is not None
                          else self._settings)
        self._child_settings = child_settings
        self._children: list[_Child] = [_Child(self._folder, child_settings, n) for n in range(self.processes)]
        try:
            for child in self._children:
                child.wait_ready()
        except BaseException:
            self.close()
            raise
        self._idle: queue.Queue[_Child] = queue.Queue()
        for child in self._children:
            self._idle.put(child)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def window(self) -> WindowPolicy:
        """The batcher's window policy, as the children's recognizers have it (both families: the setting)."""
        return WindowPolicy(self._settings.window_bucket_s)

    @property
    def local(self) -> Recognizer:
        """The version loaded in this process (checked, canary included), loaded on first use."""
        with self._local_lock:
            if self._local is None:
                log.info("loading %s in the worker process too (a batch reached no inference process)", self._folder)
                self._local = load_checked(self._folder, self._settings)
            return self._local

    # The local model and decoder: read by nothing on the decoding path, so loaded only if asked for.
    @property
    def model(self) -> Any:  # type: ignore[override]
        return self.local.model

    @property
    def decoder(self) -> Any:  # type: ignore[override]
        return self.local.decoder

    @property
    def pids(self) -> list[int | None]:
        """The children's process ids (a replaced child's successor after it died)."""
        return [child.pid for child in self._children]

    @property
    def decoding(self) -> list[int | None]:
        """Process ids of the children decoding a batch now."""
        return [child.pid for child in self._children if child.busy]

    def recognize(
        self,
        segments: Sequence[SegmentAudio],
        queue_waits_ms: Sequence[float] | None = None,
        wide: bool = False,
        on_result: SegmentOutcome | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> list[TranscriptResult | Exception]:
        """As ``Recognizer.recognize``; a segment whose audio is unusable fails here, the others are decoded
        together by a child exactly as in-process (the same batch, so the same text)."""
        waits = list(queue_waits_ms) if queue_waits_ms is not None else [0.0] * len(segments)
        slots: list[TranscriptResult | Exception | None] = [None] * len(segments)

        def tell(i: int, outcome: TranscriptResult | Exception) -> None:
            if slots[i] is not None:
                return
            slots[i] = outcome
            if on_result is not None:
                on_result(i, outcome)

        rows: list[tuple[int, SegmentAudio, np.ndarray]] = []
        for i, segment in enumerate(segments):
            try:
                rows.append((i, segment, checked_audio(segment)))
            except Exception as exc:  # noqa: BLE001 - a bad segment fails only its own slot
                tell(i, exc)
        if rows:
            child = self._take()
            if child is None:  # retired before this batch reached a child (a reload raced it): same version
                usable = [i for i, _, _ in rows]
                local = self.local.recognize([segments[i] for i in usable], [waits[i] for i in usable], wide,
                                             lambda row, outcome: tell(usable[row], outcome),
                                             [contexts[i] for i in usable] if contexts is not None else None)
                for i, outcome in zip(usable, local, strict=True):
                    tell(i, outcome)
            else:
                try:
                    child.run(rows, waits, wide, tell, contexts)
                finally:
                    self._give_back(child)
        missing = InferenceProcessError("the inference process gave no outcome for this segment")
        return [slot if slot is not None else missing for slot in slots]

    def _take(self) -> _Child | None:
        """A free child (waiting for one), or None once the children are closed."""
        with self._lock:
            if self._closed:
                return None
            self._running += 1
        child = self._idle.get()
        if child.dead is None and not child.process.is_alive():  # died while idle: not this batch's fault
            child = self._replace(child, f"inference process {child.pid} ended while idle")
        return child

    def _give_back(self, child: _Child) -> None:
        if child.dead is not None and not self._closed:  # a successor loads while this batch is answered
            child = self._replace(child, str(child.dead))
        self._idle.put(child)
        with self._lock:
            self._running -= 1
            last = self._retired and self._running == 0
        if last:
            self.close()

    def _replace(self, child: _Child, why: str) -> _Child:
        child.stop()
        successor = _Child(self._folder, self._child_settings, child.number)
        self._children[self._children.index(child)] = successor
        log.warning("%s; started inference process %s in its place", why, successor.pid)
        return successor

    def retire(self) -> None:
        """No new batches come (a newer version took over): close once the running ones have ended."""
        with self._lock:
            self._retired = True
            idle = self._running == 0
        if idle:
            self.close()

    def close(self) -> None:
        """Stop every child (a running batch's rows then fail with InferenceProcessError; a batch that had
        not reached a child is decoded in this process, by ``local``). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for child in self._children:
            child.stop()


def serve(conn: Connection, folder: str, settings: AsrSettings, number: int) -> None:
    """The child: load the folder, then decode batches until told to stop or the parent goes away."""
    with contextlib.suppress(OSError):  # the name top, ps and /proc show (and `callqa bench live` counts as
        Path("/proc/self/comm").write_text("asr-batch-proc")  # inference, as the asr-batch threads)
    try:
        recognizer = load_checked(Path(folder), settings)  # the canary too, unless the parent ran it
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send(("failed", _sendable(exc)))
        return
    conn.send(("ready", None))
    block: SharedMemory | None = None
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if message[0] != "batch":
                return
            _, name, specs, waits, wide, contexts = message
            if block is None or block.name != name:
                if block is not None:
                    block.close()
                block = SharedMemory(name=name)
            _decode(conn, recognizer, block, specs, waits, wide, contexts)
    finally:
        if block is not None:
            with contextlib.suppress(BufferError):
                block.close()


def _decode(conn: Connection, recognizer: Recognizer, block: SharedMemory, specs: list[_Row],
            waits: list[float], wide: bool, contexts: list[Sequence[int]] | None) -> None:
    shared = np.ndarray((block.size // 4,), dtype=np.float32, buffer=block.buf)
    segments = [AudioSegment(r.start_ms, r.end_ms, shared[r.offset : r.offset + r.samples]) for r in specs]
    del shared

    def send(row: int, outcome: TranscriptResult | Exception) -> None:
        if isinstance(outcome, Exception):
            outcome = _sendable(outcome)
        conn.send(("row", row, outcome))

    try:
        recognizer.recognize(segments, waits, wide, send, contexts)  # tells every row once
    except Exception as exc:  # noqa: BLE001 - recognize isolates rows; a bug fails them (the parent keeps
        for row in range(len(segments)):  # the first outcome it heard of a row)
            send(row, exc)
    finally:
        segments.clear()
    conn.send(("done",))


def _sendable(exc: Exception) -> Exception:
    """``exc`` if it survives the pipe (pickled and unpickled), else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class ProcessBatcher(SegmentBatcher):
    """A SegmentBatcher over a ProcessRecognizer: its children are closed with it and replaced on reload."""

    def swap(self, recognizer: Recognizer) -> None:
        old = self.recognizer
        super().swap(recognizer)
        if isinstance(old, ProcessRecognizer) and old is not recognizer:
            old.retire()  # closes once its running batches have ended

    async def reload(self, folder: Path, settings: AsrSettings) -> Recognizer:
        """As ``SegmentBatcher.reload``: a new set of children on the new version, each checking it (sha256s,
        signature, canary) while the running set decodes, takes the batches formed from now on; a refusal
        (the children's ModelIntegrityError) leaves the running one in place."""
        check_newer(Manifest.read(folder).version, self.recognizer.version, folder.parent.name)
        running = self.recognizer
        processes = running.processes if isinstance(running, ProcessRecognizer) else self.inference_threads
        try:
            recognizer = await asyncio.to_thread(ProcessRecognizer, folder, settings, processes)
        except InferenceProcessError as exc:  # e.g. a child killed while loading: refused, the running one stays
            raise ModelIntegrityError(f"{folder}: refused: {exc}") from exc
        try:
            self.swap(recognizer)
        except BaseException:
            recognizer.close()
            raise
        return recognizer

    async def close(self) -> None:
        await super().close()
        recognizer = self.recognizer
        if isinstance(recognizer, ProcessRecognizer):
            await asyncio.to_thread(recognizer.close)


def process_batcher(folder: Path, settings: AsrSettings, local: Recognizer | None = None) -> SegmentBatcher:
    """``settings.inference_processes`` children on ``folder`` (see ``ProcessRecognizer`` for ``local``),
    behind a batcher that runs as many batches at once (a thread per child: it only waits on the pipe;
    ``inference_threads`` is not used)."""
    processes = settings.inference_processes
    recognizer = ProcessRecognizer(folder, settings, processes, local)
    try:
        return ProcessBatcher.from_settings(recognizer, settings.model_copy(update={"inference_threads": processes}))
    except BaseException:
        recognizer.close()
        raise
