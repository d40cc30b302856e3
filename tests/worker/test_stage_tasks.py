"""CallTasks (pipeline/worker/tasks.py): a call's tasks, and what their failures do to the call and worker."""

from __future__ import annotations

import asyncio
from typing import get_args

from pipeline.worker.metrics import TASK_KINDS, WorkerMetrics
from pipeline.worker.state import CallState
from pipeline.worker.tasks import MAX_FAILURES_KEPT, CallTasks, TaskKind, stop_call


async def _fails() -> None:
    raise RuntimeError("cannot map rows")


async def _settled(call: CallState) -> None:
    await asyncio.gather(*call.pending, return_exceptions=True)
    await asyncio.sleep(0)  # done callbacks run on the next loop step


def _failed_count(metrics: WorkerMetrics, kind: str) -> float:
    return metrics.registry.get_sample_value("callqa_task_failures_total", {"task": kind}) or 0.0


async def test_a_spawned_task_is_pending_on_its_call_until_it_is_done() -> None:
    tasks, call = CallTasks(WorkerMetrics()), CallState("c1")
    gate = asyncio.Event()
    tasks.spawn(call, gate.wait(), "segment")  # type: ignore[arg-type]
    assert len(call.pending) == 1
    gate.set()
    await _settled(call)
    assert not call.pending and not call.failed and tasks.failures == []


async def test_a_failed_task_fails_its_call_and_the_worker() -> None:
    metrics = WorkerMetrics()
    tasks, call = CallTasks(metrics), CallState("c1")
    tasks.spawn(call, _fails(), "finish")
    await _settled(call)
    assert call.failed
    assert tasks.failures == ["call c1: finish task failed: RuntimeError: cannot map rows"]
    assert _failed_count(metrics, "finish") == 1


async def test_a_failed_partial_is_counted_but_fails_nothing() -> None:
    metrics = WorkerMetrics()
    tasks, call = CallTasks(metrics), CallState("c1")
    tasks.spawn(call, _fails(), "partial")
    await _settled(call)
    assert not call.failed and tasks.failures == []
    assert _failed_count(metrics, "partial") == 1


async def test_a_stopped_call_cancels_its_tasks_without_failing() -> None:
    tasks, call = CallTasks(WorkerMetrics()), CallState("c1")
    tasks.spawn(call, asyncio.Event().wait(), "segment")  # type: ignore[arg-type]
    await asyncio.sleep(0)
    stop_call(call)
    await _settled(call)
    assert call.finishing and not call.pending and not call.failed and tasks.failures == []


def test_failure_reasons_are_bounded_but_all_are_counted() -> None:
    tasks = CallTasks(WorkerMetrics())
    for i in range(MAX_FAILURES_KEPT + 5):
        tasks.fail(f"batch {i} failed")
    assert len(tasks.failures) == MAX_FAILURES_KEPT and tasks.failure_count == MAX_FAILURES_KEPT + 5
    assert tasks.failures[0] == "batch 0 failed"


def test_every_task_kind_is_exported_from_the_start() -> None:
    assert set(get_args(TaskKind)) == set(TASK_KINDS)
