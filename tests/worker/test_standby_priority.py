"""A standby's load at idle CPU priority, and its return to normal at take-over, read back from the kernel
(``sched_getscheduler`` of each thread, ``/proc/<pid>/stat``'s policy field), in a process of its own: the test
process's own threads are left as they are."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")

# Run in a child: lowers itself, starts a thread and a child process (as the model load starts ONNX Runtime's
# threads and the inference processes), reports each one's policy as the kernel has it, takes over, reports again.
SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from pathlib import Path
    from pipeline.worker import standby_priority

    def policy(pid, tid):
        # Field 41 of /proc/<pid>/task/<tid>/stat: the policy (after the comm field, which may hold spaces).
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[38])

    if standby_priority.to_idle():
        print("refused"); sys.exit(0)
    stop = threading.Event()
    started = threading.Thread(target=stop.wait, daemon=True)
    started.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    time.sleep(0.3)
    def policies():
        return sorted({policy(p, t) for p in (os.getpid(), child.pid) for t in os.listdir(f"/proc/{p}/task")})
    print("idle", policies(), flush=True)
    standby_priority.to_normal()
    print("normal", policies(), flush=True)
    child.kill(); stop.set()
""")


def test_a_standby_loads_at_idle_priority_and_every_thread_and_child_returns_to_normal_at_take_over() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True,
                         cwd=os.getcwd()).stdout.split("\n")
    if out[0] == "refused":
        pytest.skip("this process may not return from SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE 0)")
    # 5 = SCHED_IDLE, 0 = SCHED_OTHER (sched(7)): the thread and the child started while idle inherited it.
    assert out[:2] == ["idle [5]", "normal [0]"], out
