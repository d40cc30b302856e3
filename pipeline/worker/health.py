"""Is the worker fit to go on? GET /health, and the timer that makes an unfit worker exit.

A worker is unfit when a part it cannot do without has died (the batcher's collector, the ClickHouse
sink's flushing), or when a call task or a frame batch failed (a bug: results may be incomplete, so
nothing more is committed). Restarting is the recovery: the next worker replays what was not committed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.worker.dead_letters import describe_error

log = logging.getLogger("callqa.worker")

# The worker's exit status when it stops because it is unhealthy (the faust worker's own on a crash).
EXIT_UNHEALTHY = 1


class Component(Protocol):
    """A part with a background task: ``error`` says why that task died (None while it runs)."""

    @property
    def error(self) -> BaseException | None: ...


class WorkerUnhealthyError(RuntimeError):
    """The worker stops so a supervisor restarts it: the message lists the reasons."""


@dataclass
class WorkerHealth:
    components: Mapping[str, Component]
    failures: Callable[[], list[str]]  # what failed in the call core (CallProcessor.failures)
    _exiting: bool = field(default=False, init=False)

    def reasons(self) -> list[str]:
        """Why the worker is unfit, one line each; empty when it is fine."""
        died = [f"{name} died: {describe_error(error)}" for name, part in self.components.items()
                if (error := part.error) is not None]
        return died + list(self.failures())

    def report(self) -> tuple[int, dict[str, Any]]:
        """The /health answer: HTTP status and JSON body."""
        reasons = self.reasons()
        if reasons:
            return 503, {"status": "failing", "reasons": reasons}
        return 200, {"status": "ok", "reasons": []}

    def exit_reason(self) -> WorkerUnhealthyError | None:
        """Once, when the worker has become unfit: the error to stop it with (logged in one line here)."""
        reasons = self.reasons()
        if not reasons or self._exiting:
            return None
        self._exiting = True
        log.error("worker unhealthy, exiting for a restart: %s", "; ".join(reasons))
        return WorkerUnhealthyError("; ".join(reasons))


def exit_after(timeout_s: float, status: int = EXIT_UNHEALTHY) -> threading.Timer:
    """End the process with ``status`` after ``timeout_s`` whatever the event loop does: a graceful stop
    may wait forever on what died (segments queued for a dead batcher)."""

    def hard_exit() -> None:
        log.error("worker did not stop within %.0f s of becoming unhealthy; exiting now", timeout_s)
        logging.shutdown()
        os._exit(status)

    timer = threading.Timer(timeout_s, hard_exit)
    timer.daemon = True
    timer.start()
    return timer
