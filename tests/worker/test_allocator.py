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


# Blocks under the mmap threshold (on the heap), all freed but the last one, which pins the heap's top:
# glibc cannot shrink the heap from the top, so the freed middle stays resident until a trim.
TRIM_PROBE = textwrap.dedent("""
    import ctypes, sys
    from pipeline.worker.allocator import release_free_memory

    def rss_kb():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    blocks = [libc.malloc(65536) for _ in range(1000)]
    for b in blocks:
        libc.memset(b, 1, 65536)
    for b in blocks[:-1]:
        libc.free(b)
    before = rss_kb()
    released = release_free_memory() if sys.argv[1] == "trim" else False
    print(released, before - rss_kb())
""")


def _trimmed_kb(how: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE, how], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split()
    return out[0] == "True", int(out[1])


def test_a_trim_hands_back_freed_heap_memory_the_heap_top_pinned() -> None:
    released, given_back_kb = _trimmed_kb("trim")
    assert released and given_back_kb > 40_000, given_back_kb  # most of the ~64 MB freed
    kept, kept_back_kb = _trimmed_kb("none")
    assert not kept and kept_back_kb < 4_000, kept_back_kb  # without it glibc keeps them: the lever's reason
