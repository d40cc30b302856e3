"""A call's background work: decoding, emitting and completing run as tasks the call waits for.

A task that raises is a bug, not bad input (bad input is handled inside the tasks): the call's outputs
may be missing, so the call fails, nothing more is committed, and the worker reports itself unhealthy
(it exits and its input is replayed). A partial is a preview: its failure costs nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any, Literal

from pipeline.worker.dead_letters import describe_error
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.state import CallState

log = logging.getLogger("callqa.worker")

# What a call task does, for logs and callqa_task_failures_total{task} (metrics.TASK_KINDS).
TaskKind = Literal["segment", "emit", "finish", "partial"]
MAX_FAILURES_KEPT = 10  # reasons /health lists; the worker exits at the first anyway


class CallTasks:
    """Spawns call tasks (``CallState.pending``) and keeps what failed: the worker is unhealthy once
    ``failures`` holds anything."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.failures: list[str] = []
        self.failure_count = 0

    def spawn(self, call: CallState, work: Coroutine[Any, Any, None], kind: TaskKind) -> None:
        """Run ``work`` as one of the call's pending tasks (the call completes only after them)."""
        task = asyncio.create_task(work)
        call.pending.add(task)
        task.add_done_callback(call.pending.discard)
        task.add_done_callback(functools.partial(self._done, call, kind))

    def fail(self, reason: str) -> None:
        """Something failed that leaves results incomplete: from now on nothing is committed."""
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append(reason)
        self.failure_count += 1

    def _done(self, call: CallState, kind: TaskKind, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()  # cancelled: shutdown or a revoked partition
        if exc is None:
            return
        error = describe_error(exc)
        self.metrics.task_failures.labels(kind).inc()
        log.error("call %s: %s task failed: %s", call.call_id, kind, error)
        if kind != "partial":
            call.failed = True
            self.fail(f"call {call.call_id}: {kind} task failed: {error}")


def stop_call(call: CallState) -> None:
    """The call stops here (handed over): anything still running for it stops short of new work."""
    call.finishing = True
    for task in list(call.pending):
        task.cancel()
