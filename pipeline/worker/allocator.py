"""The worker's memory allocator settings: glibc's mmap threshold, fixed at start, and a periodic trim.

glibc serves blocks above the mmap threshold with their own mappings, returned to the system on free; but
it raises that threshold to the largest block freed so far (up to 32 MB). The decoder's batch buffers are
megabytes, of a new shape for each batch size, so after the first frees they come from the heap, and the
heap keeps what it grew to: a worker's RSS followed the batch shapes it had seen, not its legs. A fixed
threshold (``malloc_mmap_threshold_bytes``) keeps them mapped and returned (``mallopt(M_MMAP_THRESHOLD)``,
which also turns the dynamic adjustment off).

Below the threshold, glibc gives memory back only from the top of a heap: free chunks between blocks still
in use stay resident. Over an hour's soak the long-lived worker's RSS kept creeping up; one
``malloc_trim(0)`` there, 27 minutes in, handed back 14 MB. ``release_free_memory`` does that (it returns
whole free pages inside every arena, ``madvise``), and the worker calls it every ``malloc_trim_interval_s``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

log = logging.getLogger("callqa.worker")

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
ENV_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


@functools.cache  # find_library runs `ldconfig -p`: once per process, not at every trim
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def set_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold; False (and nothing changed) when it is 0, when the environment already
    sets it (glibc read it at start), or off glibc."""
    if threshold_bytes <= 0 or os.environ.get(ENV_VARIABLE):
        return False
    libc = _glibc()
    if libc is None:
        return False
    applied = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    if not applied:
        log.warning("glibc refused an mmap threshold of %d bytes; the dynamic one stays", threshold_bytes)
    return applied


def trim_available() -> bool:
    """Whether ``release_free_memory`` can do anything here (glibc on Linux)."""
    return _glibc() is not None


def release_free_memory() -> bool:
    """Give glibc's free pages back to the system (``malloc_trim(0)``): True when some were. ctypes drops
    the GIL for the call, so run it off the event loop and the loop goes on meanwhile."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
