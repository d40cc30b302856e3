"""A process that decodes runs numpy's BLAS on one thread (pipeline/asr/blas_threads.py): OpenBLAS's spare
pool threads spin after every call, and the log-mel's matmul per segment kept them spinning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipeline.asr.build import BuildResult

# In a fresh interpreter: this test process's own pool was already limited by the session's recognizers.
_PROBE = """
import json, sys
from pathlib import Path
from threadpoolctl import threadpool_info
from pipeline.asr.recognizer import Recognizer
from pipeline.config import Settings
def blas():
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
before = blas()
Recognizer.load(Path(sys.argv[1]), Settings(blas_threads=int(sys.argv[2]), intra_op_threads=1))
print(json.dumps({"before": before, "after": blas()}))
"""


def _pools(folder: str, blas_threads: int) -> dict[str, list[int]]:
    done = subprocess.run([sys.executable, "-c", _PROBE, folder, str(blas_threads)], capture_output=True,
                          text=True, timeout=120, check=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_loading_a_recognizer_limits_the_process_blas_pool_to_the_setting(built: BuildResult) -> None:
    pools = _pools(str(built.folder), 1)
    assert pools["before"] == [2]  # numpy's OpenBLAS as the environment started it
    assert pools["after"] == [1]


def test_blas_threads_zero_leaves_the_pool_alone(built: BuildResult) -> None:
    assert _pools(str(built.folder), 0) == {"before": [2], "after": [2]}
