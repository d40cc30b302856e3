"""The instance lock a standby worker waits on: held by a live process, free once it ends however it ends."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.worker.instance_lock import InstanceLock, instance_listener

HOLD = """
import sys, time
from pathlib import Path
from pipeline.worker.instance_lock import InstanceLock
lock = InstanceLock(Path(sys.argv[1]), "group", "pod/0")
assert lock.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold_in_child(state_dir: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_standby_waits_for_the_holder_and_takes_the_lock_when_it_is_killed(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path)
    try:
        standby = InstanceLock(tmp_path, "group", "pod/0")
        assert not standby.try_acquire() and not standby.held
        assert standby.holder() == str(child.pid)
        # Another group may use the same instance id: its lock is its own.
        assert InstanceLock(tmp_path, "other-group", "pod/0").try_acquire()
        child.send_signal(signal.SIGKILL)  # no clean exit: the lock goes with the process
        began = time.monotonic()
        standby.acquire()
        assert standby.held and time.monotonic() - began < 30
        assert standby.holder() == str(os.getpid())
        # Now this process holds it: a third one stands by.
        assert not InstanceLock(tmp_path, "group", "pod/0").try_acquire()
    finally:
        child.kill()
        child.wait()


def test_ids_that_clean_to_one_file_name_are_separate_locks(tmp_path: Path) -> None:
    first, second = InstanceLock(tmp_path, "g", "pod/0"), InstanceLock(tmp_path, "g", "pod:0")
    assert first.path != second.path
    assert first.try_acquire() and second.try_acquire()


def test_a_static_members_successor_listens_where_its_predecessor_did(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    # Its group keeps the instance's first client id, which names this port (pipeline/broker/peers.py).
    first = instance_listener("127.0.0.1", 0, tmp_path, "group", "pod-0")
    port, client_id = first.identity.port, first.identity.client_id
    first.socket.close()  # the predecessor exited
    second = instance_listener("127.0.0.1", 0, tmp_path, "group", "pod-0")
    assert (second.identity.port, second.identity.client_id) == (port, client_id)
    other = instance_listener("127.0.0.1", 0, tmp_path, "group", "pod-1")
    assert other.identity.port != port and other.identity.nonce != second.identity.nonce
    other.socket.close()
    second.socket.close()

    blocker = socket.create_server(("127.0.0.1", port))  # another process took the port meanwhile
    try:
        with caplog.at_level(logging.WARNING):
            third = instance_listener("127.0.0.1", 0, tmp_path, "group", "pod-0")
        assert third.identity.port != port and third.identity.nonce == second.identity.nonce
        assert f"liveness port {port} of instance 'pod-0' is taken" in caplog.text
        third.socket.close()
    finally:
        blocker.close()


HAND_OVER = """
import sys, time
from pathlib import Path
from pipeline.broker.peers import PeerWatch
from pipeline.config import get_settings
from pipeline.store.client import connect
from pipeline.worker import app
from pipeline.worker.instance_lock import InstanceLock, instance_listener
state = Path(sys.argv[1])
lock = InstanceLock(state, "group", "pod/0")
assert lock.try_acquire()
app._held_locks.append(lock)
connect(sys.argv[2], "callqa").command("CREATE TABLE IF NOT EXISTS calls (x UInt8) ENGINE = MergeTree ORDER BY x")
listener = instance_listener("127.0.0.1", 0, state, "group", "pod/0")
print(listener.identity.port, flush=True)
sys.stdin.readline()
app.hand_over_instance(app.Worker(None, None, None, None, PeerWatch(get_settings(), "group", listener)))
print("handed over", flush=True)
time.sleep(600)  # a slow teardown: the instance is no longer this process's
"""

SUCCEED = """
import sys
from pipeline.store.client import connect
print(sorted(r[0] for r in connect(sys.argv[1], "callqa").query("SHOW TABLES").result_rows))
"""


def test_a_stopped_worker_hands_its_instance_store_and_port_to_its_standby_before_its_process_ends(
        tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'store'}"
    child = subprocess.Popen([sys.executable, "-c", HAND_OVER, str(tmp_path), url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        standby = InstanceLock(tmp_path, "group", "pod/0")
        assert not standby.try_acquire()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "handed over"
        assert standby.try_acquire()  # no wait: released, not left to the process's end
        assert child.poll() is None
        # The store is free: a plain open (no waiting) in another process reads what the old holder wrote.
        reader = subprocess.run([sys.executable, "-c", SUCCEED, url], capture_output=True, text=True, timeout=120)
        assert reader.returncode == 0, reader.stderr
        assert reader.stdout.strip() == "['calls']"
        # So is the liveness port, which the group knows this instance by.
        successor = instance_listener("127.0.0.1", 0, tmp_path, "group", "pod/0")
        assert successor.identity.port == port
        successor.socket.close()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
