"""The worker's memory allocator settings: glibc's mmap threshold, fixed at start.

glibc serves blocks above the mmap threshold with their own mappings, returned to the system on free; but
it raises that threshold to the largest block freed so far (up to 32 MB). The decoder's batch buffers are
megabytes, of a new shape for each batch size, so after the first frees they come from the heap, and the
heap keeps what it grew to: a worker's RSS followed the batch shapes it had seen, not its legs. A fixed
threshold (``malloc_mmap_threshold_bytes``) keeps them mapped and returned (``mallopt(M_MMAP_THRESHOLD)``,
which also turns the dynamic adjustment off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger("callqa.worker")

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
ENV_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def set_mmap_threshold(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold; False (and nothing changed) when it is 0, when the environment already
    sets it (glibc read it at start), or off glibc."""
    if threshold_bytes <= 0 or os.environ.get(ENV_VARIABLE):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    applied = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    if not applied:
        log.warning("glibc refused an mmap threshold of %d bytes; the dynamic one stays", threshold_bytes)
    return applied
