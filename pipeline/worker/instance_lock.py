"""One live worker per static instance id on a host, and the standby that waits for it.

A restart that stops the old worker before the new one starts pauses its calls for the whole start: Python's
imports, the model's load and canary in each inference process, the store's migration, then the group join
(about 4.5 s on a 2-core machine, measured by the soak). A worker started under the instance id
(``CALLQA_WORKER_INSTANCE_ID``) of one still running on the same host instead loads its model beside it and
stands by: it takes this lock only when the old one exits (the lock goes with its process, however it ends),
and only then opens the store (the embedded engine admits one process per folder) and joins the group under
the same id, so no partition moves and its calls wait only for the join. Two workers that are started under
one id by mistake no longer fence each other in turns: the second waits, and says for whom.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import IO

from pipeline.broker.peers import LivenessListener, instance_nonce

log = logging.getLogger(__name__)

# What a standby says (on stderr) once its model is loaded: a hand-over stops the old worker only then.
STANDBY_READY = "standby ready"


class InstanceLock:
    """An exclusive ``flock`` on ``<state_dir>/instances/<group>.<id>.lock`` (an instance id is unique within its
    consumer group only), held until the worker has stopped (``release``) or its process ends, however it
    ends (the file closes then, a kill -9 included). The holder's pid is written in it, for the standby's
    message."""

    def __init__(self, state_dir: Path, group: str, instance_id: str) -> None:
        self.instance_id = instance_id
        # Any id a pod may have becomes a file name; the hash keeps two ids that clean to one name apart.
        name = f"{group}.{instance_id}"
        clean = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]
        digest = hashlib.sha256(f"{group}\0{instance_id}".encode()).hexdigest()[:12]
        self.path = Path(state_dir) / "instances" / f"{clean}-{digest}.lock"
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def try_acquire(self) -> bool:
        """Take the lock if no live process holds it; True when this process holds it now."""
        return self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB)

    def acquire(self) -> None:
        """Wait until the process holding the lock ends, then hold it (a SIGTERM meanwhile ends this process,
        as before any other start-up step)."""
        self._lock(fcntl.LOCK_EX)

    def release(self) -> None:
        """Hand the instance on: a standby waiting in ``acquire`` takes it now."""
        if self._file is not None:
            self._file.close()  # closing the file drops its flock
            self._file = None

    def holder(self) -> str:
        """The pid the holder wrote, or "" (not written yet, or unreadable)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def _lock(self, flags: int) -> bool:
        if self._file is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # "a": opening must not empty the holder's pid before the lock is ours.
        handle = open(self.path, "a")  # noqa: SIM115 - kept open for the life of the process
        try:
            fcntl.flock(handle, flags)
        except BlockingIOError:
            handle.close()
            return False
        except BaseException:
            handle.close()
            raise
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return True


def instance_listener(host: str, port: int, state_dir: Path, group: str, instance_id: str) -> LivenessListener:
    """A static member's liveness listener: the client id the coordinator keeps for the instance names its
    first process's port (pipeline/broker/peers.py), so each successor listens where its predecessor did:
    ``port`` when one is configured, else the one recorded beside the instance's lock (taken once the
    predecessor has exited and closed it). A recorded port some other process holds now is left for a free
    one, said once: the peers then cannot watch this instance until it leaves the group."""
    record = InstanceLock(state_dir, group, instance_id).path.with_suffix(".liveness-port")
    recorded = 0
    if not port:
        with contextlib.suppress(OSError, ValueError):  # none recorded yet, or unreadable: a free port
            recorded = int(record.read_text().strip() or 0)
    nonce = instance_nonce(group, instance_id)
    try:
        listener = LivenessListener(host, port or recorded, group, nonce)
    except OSError as exc:
        if port or not recorded or exc.errno != errno.EADDRINUSE:
            raise
        log.warning("liveness port %d of instance %r is taken by another process: listening on a free one, which "
                    "the group's peers will not find (set CALLQA_PEER_WATCH_PORT)", recorded, instance_id)
        listener = LivenessListener(host, 0, group, nonce)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{listener.identity.port}\n")
    return listener
