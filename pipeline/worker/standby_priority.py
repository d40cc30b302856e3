"""A standby loads its model at idle CPU priority, and goes back to normal when it takes over.

A standby starts on the host of the worker it replaces (pipeline/worker/instance_lock.py) and loads beside it:
Python's imports, the model's sessions, the canary. On a host whose cores the serving worker uses, that load
took the worker's CPU: measured by `callqa bench soak` at 3 calls (each worker pinned to one core, with
headroom), the standby loaded for 5-8 s and the slowest finals after a restart were turns that ended 1.1-3.3 s
before the SIGTERM and were still open then. Under Linux's ``SCHED_IDLE`` policy a thread runs only on CPU time
nothing else wants: the load takes about as long (6-8 s), and the worker being replaced keeps its pace (the
slowest turns then end within a second of the SIGTERM). At 6 calls, a load a core only just carries, it made
no difference: the serving worker was behind its audio anyway.

Policies are per thread and inherited by threads and processes started afterwards, so the process lowers
every thread it has and what it starts later inherits it; at take-over every thread of the process and of its
children (the inference processes) goes back to ``SCHED_OTHER``. Going back from ``SCHED_IDLE`` needs
``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows nice 0: it is tried on a probe thread first, and where it is
refused the standby loads at normal priority (a worker stuck at idle priority would be far worse).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_PROC = Path("/proc")


def _threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in (_PROC / str(pid) / "task").iterdir()]
    except OSError:
        return []  # the process ended meanwhile


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for tid in _threads(pid):
        try:
            found += [int(c) for c in (_PROC / str(pid) / "task" / str(tid) / "children").read_text().split()]
        except OSError:
            continue
    return found


def process_tree(pid: int | None = None) -> list[int]:
    """``pid`` (this process by default) and every process below it."""
    tree, todo = [], [pid or os.getpid()]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += _children(p)
    return tree


def _set(tid: int, policy: int) -> bool:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
        return True
    except (OSError, ProcessLookupError):
        return False


def can_return_from_idle() -> bool:
    """Whether a thread of this process may go from ``SCHED_IDLE`` back to ``SCHED_OTHER``: tried on a probe."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    result: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        result.append(_set(tid, os.SCHED_IDLE) and _set(tid, os.SCHED_OTHER))

    thread = threading.Thread(target=probe, name="callqa-priority-probe")
    thread.start()
    thread.join()
    return bool(result and result[0])


def to_idle() -> str:
    """Every thread of this process to ``SCHED_IDLE`` (threads and processes started later inherit it), if it can
    be undone: "" when done, else why not."""
    if not can_return_from_idle():
        return "this process may not return from SCHED_IDLE (CAP_SYS_NICE or RLIMIT_NICE)"
    failed = []
    for tid in _threads(os.getpid()):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            failed.append(f"thread {tid}: {exc.strerror}")
    if failed:
        to_normal()
        return "; ".join(failed)
    return ""


def to_normal() -> int:
    """Every thread of this process and of its children back to ``SCHED_OTHER``; how many were changed. This
    thread first, so any thread it starts from here on is normal."""
    changed = int(_set(threading.get_native_id(), os.SCHED_OTHER))
    for pid in process_tree():
        for tid in _threads(pid):
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    changed += _set(tid, os.SCHED_OTHER)
            except OSError:
                continue
    return changed
