"""The worker's fixed mmap threshold: freed decoder-sized buffers go back to the system instead of staying
in glibc's heap (what made RSS per leg follow the batch shapes a worker had seen)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pipeline.worker.allocator import set_mmap_threshold

REPO = Path(__file__).resolve().parents[2]

# Buffers of 1-8 MB in a new shape each round (as the decoder's per batch size), small long-lived blocks
# allocated between them, everything big freed: how much RSS is still held afterwards (KB)?
PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from pipeline.worker.allocator import set_mmap_threshold

    def rss_kb():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))

    applied = set_mmap_threshold(int(sys.argv[1]))
    base, keep = rss_kb(), []
    for r in range(30):
        buffers = [np.ones((k + 1) * 262144 + r * 1000, np.float32) for k in range(8)]
        keep.append(np.ones(2000, np.float32))
        del buffers
    print(applied, rss_kb() - base)
""")


def _held_kb(threshold: int) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(threshold)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split()
    return out[0] == "True", int(out[1])


def test_freed_batch_buffers_go_back_to_the_system_with_the_fixed_threshold() -> None:
    fixed_applied, fixed_kb = _held_kb(131072)
    dynamic_applied, dynamic_kb = _held_kb(0)
    assert fixed_applied and not dynamic_applied
    assert fixed_kb < 2048, fixed_kb  # the buffers were mapped and unmapped
    assert dynamic_kb > 8192, dynamic_kb  # glibc's dynamic threshold kept tens of MB: the lever's reason


def test_the_environment_variable_wins(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert set_mmap_threshold(131072) is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert set_mmap_threshold(0) is False
