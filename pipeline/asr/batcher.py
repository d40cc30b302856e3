"""SegmentBatcher: one per worker process, shared by all streams, turning segments into batched decodes.

Streams `await batcher.submit(segment)`. A collector task waits for a free inference thread, then
gathers segments until `max_batch` are waiting or the oldest has waited `max_wait_ms`, takes the oldest
segment's window bucket first (so one batch pads little), and hands the batch to that thread. With
`inference_threads` > 1 several batches run at once, each on its own core (ONNX Runtime releases the
GIL while it runs): one batch spread over intra-op threads left a core idle in its serial parts and
contended with the event loop. While every thread is busy, segments queue, so batches grow with the
load. The queue is bounded: when it is full, `submit` waits (back-pressure up to the stream consumers).

Which waiting segments a batch takes (`batch_order`): "oldest" takes the oldest segment's
window bucket first, then the others by age; "shortest" takes the shortest windows first (a short reply
does not wait behind a long turn that arrived before it), except that a segment that has waited
`batch_age_limit_ms` goes before any younger one, so a long turn is not starved under load. To choose,
"shortest" takes everything queued when a thread frees (not only the first `max_batch`) and holds what
the batch leaves for the next one (`queued` counts them). The order only matters when more than
`max_batch` wait; a batch's rows are released one by one as each ends (``on_result``) either way.

`batch_spread`: when several threads are free, the waiting segments are shared out among them (a batch
takes its share, rounded up; the rest go to the next free thread at once) rather than all to the first,
which left the other core idle while one process encoded four Moonshine rows one after another (bench live
at 12 calls on 2 cores, against off in the same run: P99 1.02 -> 0.86 s, 0.88x the worker's CPU).

`batch_one_window`: a batch takes only segments of its first segment's window bucket, and the rest wait
for the next free inference thread (with two decoding processes, the other core). A batch encodes each
window group separately, but every row waits for all groups' encodes and then decodes beside the longest
row's cross-attention: a 1.8 s reply batched with a 13 s turn took 1.2 s (bench live, 14 calls).

Previews (partial transcripts: ``submit(..., preview=True)``) give way to finals: a batch holds finals
or previews, never both; previews go only when no final waits, and with several threads a preview batch
never takes the last free one (it stays for the next final, which would otherwise wait out a preview's
whole decode). A preview that has waited ``preview_max_wait_ms`` is dropped undecoded (its submit raises
``PreviewDroppedError``): the leg's next preview supersedes it, and under load previews cost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

import numpy as np

from pipeline.asr.canary import load_checked
from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.manifest import Manifest
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import SegmentAudio, TranscriptResult
from pipeline.audio.mel import HOP_LENGTH
from pipeline.config.asr import AsrSettings


class ModelVersionError(RuntimeError):
    """A model swap offered a version that is not newer than the one running."""


class BatcherClosedError(RuntimeError):
    """submit() after close()."""


class BatcherDeadError(RuntimeError):
    """submit() after the collector task died: nothing would ever transcribe the segment."""


class PreviewDroppedError(RuntimeError):
    """A preview was dropped undecoded: it waited ``preview_max_wait_ms`` behind finals, or the batcher closed."""


# eq=False: a request is itself, not its fields. Field equality compared two requests of the same span by their
# audio arrays (list.remove of a dropped preview), which raises, and the collector died of it.
@dataclass(eq=False)
class _Pending:
    segment: SegmentAudio
    future: asyncio.Future[TranscriptResult]
    enqueued: float
    bucket: int
    context: tuple[int, ...] = ()  # tokens of the leg's previous text (see LegContext)
    preview: bool = False  # a partial transcript: gives way to finals, dropped when stale


class SegmentBatcher:
    def __init__(
        self,
        recognizer: Recognizer,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 30.0,
        queue_size: int = 256,
        window: WindowPolicy | None = None,
        inference_threads: int = 1,
        order: Literal["oldest", "shortest"] = "oldest",
        age_limit_ms: float = 1000.0,
        one_window: bool = False,
        spread: bool = False,
        preview_max_wait_ms: float = 1000.0,
    ) -> None:
        self._recognizer = recognizer
        self.spread = spread
        self.preview_max_wait_s = preview_max_wait_ms / 1000.0
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.order = order
        self.age_limit_s = age_limit_ms / 1000.0
        self.one_window = one_window
        self._window = window or recognizer.window
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue(maxsize=queue_size)
        self.inference_threads = max(1, inference_threads)
        self._executor = ThreadPoolExecutor(
            max_workers=self.inference_threads, thread_name_prefix="asr-batch", initializer=_name_os_thread
        )
        self._free_threads = asyncio.Semaphore(self.inference_threads)
        self._free = self.inference_threads  # threads not running a batch (the semaphore's count, readable)
        self._released = asyncio.Event()  # a thread freed (previews waiting for a spare one look again)
        self.previews_dropped = 0
        self._running: set[asyncio.Task[None]] = set()
        self._held = 0  # segments taken off the queue that wait for a later batch (batch_order)
        self._held_previews = 0  # of those, previews
        self._preview_batches: set[asyncio.Task[None]] = set()  # running batches of previews
        self._failure: BaseException | None = None  # a batch task's bug: the batcher is dead
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, recognizer: Recognizer, settings: AsrSettings) -> SegmentBatcher:
        return cls(
            recognizer,
            max_batch=settings.max_batch,
            max_wait_ms=settings.max_wait_ms,
            queue_size=settings.batcher_queue_size,
            inference_threads=inference_threads(settings.inference_threads),
            order=settings.batch_order,
            age_limit_ms=settings.batch_age_limit_ms,
            one_window=settings.batch_one_window,
            spread=settings.batch_spread,
            preview_max_wait_ms=settings.preview_max_wait_ms,
        )

    @property
    def recognizer(self) -> Recognizer:
        return self._recognizer

    @property
    def queued(self) -> int:
        """Segments waiting for a batch: in the queue, and held back by the ordering for a later one."""
        return self._queue.qsize() + self._held

    @property
    def idle(self) -> bool:
        """No final queued and no batch of finals running (a segment the collector is gathering others for
        is neither: it may be joined). Previews do not count: what waits for idle (early decodes) is
        submitted as finals, which go before them."""
        return (self._queue.qsize() + self._held - self._held_previews == 0
                and not (self._running - self._preview_batches))

    @property
    def error(self) -> BaseException | None:
        """Why the collector task stopped before ``close()`` (a bug: queued segments wait forever), or None."""
        if self._failure is not None and not self._closed:
            return self._failure
        task = self._task
        if task is None or not task.done() or self._closed:
            return None
        if task.cancelled():
            return BatcherDeadError("the collector task was cancelled")
        return task.exception() or BatcherDeadError("the collector task ended")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._collect(), name="segment-batcher")

    async def close(self) -> None:
        """Finish every queued segment, then stop the collector and the worker thread."""
        if self._closed:
            return
        dead = self.error is not None  # no collector to take the sentinel (the queue may be full)
        self._closed = True
        if self._task is not None and not dead:
            await self._queue.put(None)
            await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, segment: SegmentAudio, context: Sequence[int] = (), *, preview: bool = False,
                     ) -> TranscriptResult:
        """Queue a segment (waiting while the queue is full) and return its transcript; decoded after
        ``context``, the tokens of its leg's previous text, when the model's settings take context.
        ``preview``: a partial transcript, which gives way to finals and may be dropped
        (``PreviewDroppedError``; see the module's docstring)."""
        if self._closed:
            raise BatcherClosedError("the batcher is closed")
        if self.error is not None:
            raise BatcherDeadError(f"the batcher's collector died: {self.error!r}")
        future: asyncio.Future[TranscriptResult] = asyncio.get_running_loop().create_future()
        frames = int(np.asarray(segment.audio).size) // HOP_LENGTH
        await self._queue.put(
            _Pending(segment, future, time.perf_counter(), self._window.window_frames(frames), tuple(context),
                     preview)
        )
        return await future

    def swap(self, recognizer: Recognizer) -> None:
        """Use `recognizer` for batches formed from now on; a running batch finishes on the old one."""
        check_newer(recognizer.version, self._recognizer.version, recognizer.name)
        self._recognizer = recognizer

    async def reload(self, folder: Path, settings: AsrSettings) -> Recognizer:
        """Load a model folder in a thread and swap to it, refusing (before any batch sees it) a version
        that is not newer, a file or signature that does not check out, or a failed canary."""
        check_newer(Manifest.read(folder).version, self._recognizer.version, folder.parent.name)
        recognizer = await asyncio.to_thread(load_checked, folder, settings)
        self.swap(recognizer)
        return recognizer

    async def _collect(self) -> None:
        pending: list[_Pending] = []
        closing = False
        try:
            while not (closing and not pending):
                if not pending:
                    item = await self._queue.get()
                    if item is None:
                        break
                    pending.append(item)
                if closing:
                    self._drop_previews(pending, "the batcher closed")
                    if not pending:
                        break
                if not any(not p.preview for p in pending) and not self._preview_may_run():
                    closing = await self._wait_for_final_or_thread(pending) or closing
                    continue
                # A batch forms only once a thread can take it: while all are busy, segments keep
                # arriving, and the next batch holds all of them (up to max_batch).
                await self._free_threads.acquire()
                closing = await self._gather(pending) or closing
                if (self.order != "oldest" or pending[0].preview) and not closing:
                    # Ordering can only choose among what it sees: everything queued now, not just the
                    # first max_batch (the rest is held here, in arrival order, for the next batch); a
                    # preview first looks for finals queued behind it.
                    closing = self._drain(pending)
                batch, pending = self._next_batch(pending)
                self._hold(pending)
                if not batch:  # only stale previews were waiting
                    self._free_threads.release()
                    continue
                self._free -= 1
                task = asyncio.create_task(self._run_and_release(batch), name="segment-batch")
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                if batch[0].preview:
                    self._preview_batches.add(task)
                    task.add_done_callback(self._preview_batches.discard)
        finally:
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)

    def _next_batch(self, pending: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
        """The next batch and what waits: finals if any wait (in ``order``), else previews, oldest first.
        Stale previews are dropped first."""
        self._expire_previews(pending)
        finals = [p for p in pending if not p.preview]
        previews = [p for p in pending if p.preview]
        if finals:
            batch, rest = self._take_batch(finals, self._share(len(finals)))
            return batch, sorted(rest + previews, key=lambda p: p.enqueued)
        if previews and not self._preview_may_run():
            return [], previews
        size = self._share(len(previews))
        return previews[:size], previews[size:]

    def _preview_may_run(self) -> bool:
        """Whether a preview batch may take a thread now: a free one, and with several threads not the last."""
        return self._free >= (1 if self.inference_threads == 1 else 2)

    async def _wait_for_final_or_thread(self, pending: list[_Pending]) -> bool:
        """Only previews wait and may not run yet: wait for a segment to arrive (added to ``pending``), a
        thread to free, or the oldest preview to go stale (then dropped); True on close."""
        self._hold(pending)
        self._released.clear()
        timeout = None
        if self.preview_max_wait_s > 0:
            timeout = max(0.0, min(p.enqueued for p in pending) + self.preview_max_wait_s - time.perf_counter())
        arrival = asyncio.ensure_future(self._queue.get())
        freed = asyncio.ensure_future(self._released.wait())
        try:
            await asyncio.wait({arrival, freed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            freed.cancel()
            if not arrival.done():
                arrival.cancel()  # Queue.get leaves the item in the queue when cancelled while waiting
        closing = False
        if arrival.done() and not arrival.cancelled():
            item = arrival.result()
            if item is None:
                closing = True
            else:
                pending.append(item)
        self._expire_previews(pending)
        self._hold(pending)
        return closing

    def _hold(self, pending: list[_Pending]) -> None:
        """Count what the collector holds for a later batch (``queued``, ``idle``)."""
        self._held = len(pending)
        self._held_previews = sum(p.preview for p in pending)

    def _expire_previews(self, pending: list[_Pending]) -> None:
        """Drop the previews that have waited ``preview_max_wait_ms`` (0: never)."""
        if self.preview_max_wait_s <= 0:
            return
        stale_before = time.perf_counter() - self.preview_max_wait_s
        stale = [p for p in pending if p.preview and p.enqueued <= stale_before]
        if stale:
            self._drop(pending, stale, f"waited {self.preview_max_wait_s * 1000:.0f} ms behind finals")

    def _drop_previews(self, pending: list[_Pending], why: str) -> None:
        self._drop(pending, [p for p in pending if p.preview], why)

    def _drop(self, pending: list[_Pending], dropped: list[_Pending], why: str) -> None:
        for p in dropped:
            pending.remove(p)
            self.previews_dropped += 1
            if not p.future.done():
                p.future.set_exception(PreviewDroppedError(f"preview dropped undecoded: {why}"))

    async def _run_and_release(self, batch: list[_Pending]) -> None:
        try:
            await self._run(batch)
        except BaseException as exc:
            # A bug (recognize isolates a segment's own failure): its segments would wait forever, so
            # the batcher is dead, `error` says why, and the worker's health check stops the worker.
            self._failure = exc
            if self._task is not None:
                self._task.cancel()
            raise
        finally:
            self._free += 1
            self._free_threads.release()
            self._released.set()

    def _share(self, waiting: int) -> int:
        """The most segments the next batch takes: ``max_batch``, or with ``spread`` this thread's share of
        the ``waiting`` ones among the free threads (this one included), rounded up."""
        if not self.spread or self._free <= 1:
            return self.max_batch
        return min(self.max_batch, -(-waiting // self._free))

    def _take_batch(self, pending: list[_Pending], size: int) -> tuple[list[_Pending], list[_Pending]]:
        """The next batch (at most ``size``) and what waits for a later one, in `order` (see ``take_batch``)."""
        return take_batch(pending, size, self.order, self.age_limit_s, time.perf_counter(), self.one_window)

    def _drain(self, pending: list[_Pending]) -> bool:
        """Add every segment queued now to `pending` (up to the queue's size more than a batch, so held
        segments stay bounded and submit's back-pressure still holds); True on close."""
        while len(pending) < self._queue.maxsize + self.max_batch:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return False
            if item is None:
                return True
            pending.append(item)
        return False

    async def _gather(self, pending: list[_Pending]) -> bool:
        """Add queued segments to `pending` until max_batch or the oldest's deadline; True on close."""
        deadline = pending[0].enqueued + self.max_wait_s
        while len(pending) < self.max_batch:
            timeout = deadline - time.perf_counter()
            try:
                item = (
                    self._queue.get_nowait()
                    if timeout <= 0
                    else await asyncio.wait_for(self._queue.get(), timeout)
                )
            except (asyncio.QueueEmpty, TimeoutError):
                return False
            if item is None:
                return True
            pending.append(item)
        return False

    async def _run(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]  # a cancelled submit needs no decode
        if not live:
            return
        recognizer = self._recognizer
        now = time.perf_counter()
        waits = [(now - p.enqueued) * 1000 for p in live]
        loop = asyncio.get_running_loop()
        # Nothing else waits for the cores (no segment queued, no other batch running): this batch may
        # encode on all of them (Recognizer.recognize's ``wide``; the same text either way).
        wide = self.queued == 0 and len(self._running) <= 1

        def settle(p: _Pending, outcome: TranscriptResult | Exception) -> None:
            if p.future.done():
                return
            if isinstance(outcome, Exception):
                p.future.set_exception(outcome)
            else:
                p.future.set_result(outcome)

        def settle_soon(i: int, outcome: TranscriptResult | Exception) -> None:
            # From the inference thread: a segment is final while its batch still decodes others.
            loop.call_soon_threadsafe(settle, live[i], outcome)

        contexts = [p.context for p in live] if any(p.context for p in live) else None
        try:
            results = await loop.run_in_executor(
                self._executor, recognizer.recognize, [p.segment for p in live], waits, wide, settle_soon, contexts
            )
        except Exception as exc:  # noqa: BLE001 - recognize isolates per segment; this is a last resort
            results = [exc] * len(live)
        for p, result in zip(live, results, strict=True):
            settle(p, result)


class Queued(Protocol):
    """What batch ordering reads of a waiting segment (``_Pending``)."""

    @property
    def enqueued(self) -> float: ...
    @property
    def bucket(self) -> int: ...


Q = TypeVar("Q", bound=Queued)


def take_batch(
    pending: list[Q], max_batch: int, order: str = "oldest", age_limit_s: float = 1.0, now: float = 0.0,
    one_window: bool = False,
) -> tuple[list[Q], list[Q]]:
    """The next batch (up to ``max_batch`` of ``pending``, which is in arrival order) and what waits.

    "oldest": the oldest segment's window bucket first, then the others by age (the order before issue
    25). "shortest": the segments that have waited ``age_limit_s`` or more (at ``now``, the clock of
    ``enqueued``) first, oldest first, then the rest by window bucket, shortest first, and by age within
    a bucket. ``one_window``: only segments of the first one's bucket. What waits stays in arrival order."""
    if order == "oldest":
        first = pending[0].bucket
        ranked = [i for i, p in enumerate(pending) if p.bucket == first]
        if not one_window:
            ranked += [i for i, p in enumerate(pending) if p.bucket != first]
    elif order == "shortest":
        aged = [i for i, p in enumerate(pending) if now - p.enqueued >= age_limit_s]
        aged.sort(key=lambda i: pending[i].enqueued)
        rest = sorted(
            (i for i in range(len(pending)) if now - pending[i].enqueued < age_limit_s),
            key=lambda i: (pending[i].bucket, pending[i].enqueued),
        )
        ranked = aged + rest
        if one_window:
            first = pending[ranked[0]].bucket
            ranked = [i for i in ranked if pending[i].bucket == first]
    else:
        raise ValueError(f"unknown batch order {order!r}: oldest or shortest")
    chosen = ranked[:max_batch]
    taken = set(chosen)
    return [pending[i] for i in chosen], [p for i, p in enumerate(pending) if i not in taken]


def _name_os_thread() -> None:
    """Name the inference thread for the OS too (Python 3.11 names only its own Thread object), so
    per-thread CPU in /proc, top -H or the live benchmark shows where inference time goes."""
    with contextlib.suppress(OSError):  # not Linux: only the name in tools is lost
        Path("/proc/thread-self/comm").write_text("asr-batch")


def inference_threads(setting: int) -> int:
    """Batches run at once: ``setting``, or with 0 one per core this process may use."""
    return setting if setting > 0 else max(1, len(os.sched_getaffinity(0)))


def inference_processes(setting: int) -> int:
    """Child processes to decode in: ``setting``, or with -1 (auto) two when this process may use two or
    more cores, else none (in-process): two measured best on 2 cores; one core has none to spare."""
    if setting >= 0:
        return setting
    return 2 if len(os.sched_getaffinity(0)) >= 2 else 0


def check_newer(offered: int, running: int, name: str) -> None:
    if offered <= running:
        raise ModelVersionError(
            f"refusing model {name} version {offered}: not newer than the running version {running}"
        )
