"""numpy's BLAS thread pool in a process that decodes segments.

The decode path's only BLAS call is the log-mel's filterbank matmul (pipeline/audio/mel.py), a few
milliseconds per segment. OpenBLAS runs it on a pool of one thread per core whose threads spin for a while
after every call before they sleep: in each decoding process the pool's spare thread spun at 0.09 cores
(26 % of that process's CPU, bench live at 14 calls), and a matmul every 50 ms kept a whole core spinning.
One thread spins nowhere, and the engine alone was not slower for it (40.0 against 36.5 speech s/s on
the same segments, run 20261203T080505Z).
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def limit_blas_threads(threads: int) -> None:
    """From now on this process's BLAS libraries use at most ``threads`` threads (0: leave them as they are).
    Process-wide, and kept: the decoding process (or the worker decoding in-process) wants it for its life."""
    if threads > 0:
        threadpool_limits(limits=threads, user_api="blas")
