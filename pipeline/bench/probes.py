"""The benchmarks' one sampler: what they read off a running process (a worker, the gateway): its
Prometheus /metrics (a metric, every callqa_* series, a histogram and its quantiles, a worker's sample of
lag, queue, calls and batches), and from /proc its CPU time (by thread, for a worker) and resident memory.

CPU is split by thread: the event loop (the main thread: faust's asyncio loop runs the agents, the front
ends and the VAD), inference (the batcher's ``asr-batch*`` threads, where ONNX Runtime decodes), native
pools (threads without a name of their own, e.g. ONNX Runtime's extra intra-op threads when
intra_op_threads > 1) and other (named native threads such as ClickHouse's, other Python threads, threads
that exited: the process total minus the rest). The batcher names its threads for the OS
(``/proc/<pid>/task/*/comm``); Python 3.11 does not do that for its other threads (faust's Kafka consumer
thread), whose names come from ``py-spy dump`` when py-spy is installed. A worker whose inference threads
carry no name (older than the batcher's naming) has its busiest unnamed thread taken for inference, and
the JSON says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
INFERENCE_THREAD_PREFIX = "asr-batch"
BATCH_SIZE = "callqa_batch_size"  # the batcher's histogram (pipeline/worker/metrics.py)
CONSUMER_LAG = "callqa_consumer_lag"  # messages behind the log end, per input partition
QUEUE_DEPTH = "callqa_batcher_queue_depth"
FINALS = "callqa_segments_total"  # label kind="final"


# ---- CPU and memory from /proc -----------------------------------------------------------------------
def _cpu_seconds(stat_text: str) -> float:
    # The name (field 2) may hold spaces and parentheses: count fields from the last ')'.
    fields = stat_text[stat_text.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15)


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of a process (exited threads included) and of each live thread, by thread id."""

    process_s: float
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  # tid -> (name, CPU s)


def cpu_snapshot(pid: int) -> CpuSnapshot:
    """The process's CPU and its threads', its live child processes' included (the decoding children of
    ``CALLQA_INFERENCE_PROCESSES``, named asr-batch-proc, count as inference threads)."""
    proc = Path(f"/proc/{pid}")
    threads: dict[int, tuple[str, float]] = {}
    children: list[int] = []
    for task in (proc / "task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            threads[int(task.name)] = (name, _cpu_seconds((task / "stat").read_text()))
            children.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue  # the thread exited while we looked
    process_s = _cpu_seconds((proc / "stat").read_text())
    for child in children:
        try:
            below = cpu_snapshot(child)
        except (OSError, ValueError, IndexError):
            continue  # the child exited while we looked
        process_s += below.process_s
        threads.update(below.threads)
    return CpuSnapshot(process_s, threads)


def python_thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``py-spy dump`` (without pausing the process); empty when
    py-spy is not installed or may not read the process."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return {}
    try:
        done = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)],  # noqa: S603 - our own tool
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \(.*?\): "(.*)"$', done.stdout, re.MULTILINE)}


MAIN = "main (event loop)"
UNNAMED = "unnamed native threads"


def thread_label(tid: int, pid: int, comm: str, main_comm: str, python_names: dict[int, str]) -> str:
    """What a thread is called in the split: the event loop, its Python name (a pool's threads under one
    name: "asr-batch_0" -> "asr-batch"), its own OS name, or unnamed (it kept the process's name)."""
    if tid == pid:
        return MAIN
    if tid in python_names:
        return _group_name(python_names[tid])
    return _group_name(comm) if comm != main_comm else UNNAMED


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds a worker used between two snapshots, by part; ``wall_s`` the time between them."""

    wall_s: float
    total_s: float
    by_label: dict[str, float]
    inference_by: str  # how the inference thread was found: "thread name" or "busiest unnamed thread"

    @property
    def event_loop_s(self) -> float:
        return self.by_label.get(MAIN, 0.0)

    @property
    def inference_s(self) -> float:
        return sum(v for k, v in self.by_label.items() if k.startswith(INFERENCE_THREAD_PREFIX))

    @property
    def native_pools_s(self) -> float:
        return self.by_label.get(UNNAMED, 0.0)

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.event_loop_s - self.inference_s - self.native_pools_s)

    @property
    def cores_used(self) -> float:
        return self.total_s / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def combined(cls, splits: Sequence[CpuSplit]) -> CpuSplit:
        """Several workers' CPU over the same window as one: seconds add up, so cores_used is the group's."""
        by_label: dict[str, float] = {}
        for split in splits:
            for label, seconds in split.by_label.items():
                by_label[label] = by_label.get(label, 0.0) + seconds
        return cls(max(s.wall_s for s in splits), sum(s.total_s for s in splits), by_label,
                   "; ".join(sorted({s.inference_by for s in splits})))

    def as_json(self) -> dict[str, object]:
        parts = {"event_loop": self.event_loop_s, "inference": self.inference_s,
                 "native_pools": self.native_pools_s, "other": self.other_s}
        return {
            "cores_used": round(self.cores_used, 3),
            "cpu_s": {**{k: round(v, 2) for k, v in parts.items()}, "total": round(self.total_s, 2)},
            # Cores each part kept busy on average (1.0 = one core all the time).
            "cores": {k: round(v / self.wall_s, 3) if self.wall_s > 0 else 0.0 for k, v in parts.items()},
            "inference_thread_by": self.inference_by,
            "cpu_s_by_thread": {k: round(v, 2) for k, v in sorted(self.by_label.items(), key=lambda kv: -kv[1])},
        }


def _group_name(name: str) -> str:
    """Threads of one pool under one name ("asr-batch_0" -> "asr-batch", "ThreadPoolExecutor-1_3" -> ...)."""
    return re.sub(r"([-_]\d+)+$", "", name) or name


def cpu_split(pid: int, before: CpuSnapshot, after: CpuSnapshot, wall_s: float,
              python_names: dict[int, str]) -> CpuSplit:
    main_comm = after.threads.get(pid, ("", 0.0))[0]
    used: dict[int, tuple[str, float]] = {}
    for tid, (comm, cpu) in after.threads.items():
        # A thread born in the window: all of its time.
        used[tid] = (thread_label(tid, pid, comm, main_comm, python_names), cpu - before.threads.get(tid, (comm, 0.0))[1])
    inference_by = "thread name"
    if not any(label.startswith(INFERENCE_THREAD_PREFIX) for label, _ in used.values()):
        unnamed = [tid for tid, (label, _) in used.items() if label == UNNAMED]
        if unnamed:  # no names to go by: under load the inference thread is by far the busiest of these
            busiest = max(unnamed, key=lambda tid: used[tid][1])
            used[busiest] = (INFERENCE_THREAD_PREFIX, used[busiest][1])
            inference_by = "busiest unnamed thread (no thread names)"
    by_label: dict[str, float] = {}
    for label, seconds in used.values():
        by_label[label] = by_label.get(label, 0.0) + seconds
    return CpuSplit(wall_s, after.process_s - before.process_s, by_label, inference_by)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (its own threads, not its children)."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# ---- /metrics ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricsSample:
    """One scrape of the worker's /metrics, ``t_s`` in traffic time."""

    t_s: float
    audio_lag: int | None  # frames behind the audio topic's end, all partitions (None: not reported yet)
    queue_depth: float
    active_calls: float
    active_legs: float
    finals: float
    batch_buckets: dict[float, float]  # upper bound -> batches of at most that many segments (cumulative)
    batch_count: float
    batch_sum: float
    rss_bytes: int = 0

    @classmethod
    def combined(cls, samples: Sequence[MetricsSample]) -> MetricsSample:
        """Several workers' scrapes as one group's: counts, queues, lag and memory add up (the lag is None
        only while no worker reports one)."""
        lags = [s.audio_lag for s in samples if s.audio_lag is not None]
        buckets: dict[float, float] = {}
        for s in samples:
            for bound, count in s.batch_buckets.items():
                buckets[bound] = buckets.get(bound, 0.0) + count
        return cls(max(s.t_s for s in samples), sum(lags) if lags else None, sum(s.queue_depth for s in samples),
                   sum(s.active_calls for s in samples), sum(s.active_legs for s in samples),
                   sum(s.finals for s in samples), buckets, sum(s.batch_count for s in samples),
                   sum(s.batch_sum for s in samples), sum(s.rss_bytes for s in samples))


def fetch_metrics(port: int, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:  # noqa: S310
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples on a /metrics page whose labels include ``labels`` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def metric_sums(text: str) -> dict[str, float]:
    """Every callqa_* series of a /metrics page, summed over its labels (histogram buckets left out)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        name = head.partition("{")[0]
        if line.startswith("callqa_") and not name.endswith("_bucket"):
            with suppress(ValueError):
                sums[name] = sums.get(name, 0.0) + float(value)
    return sums


def histogram(text: str, name: str) -> dict[str, float]:
    """A histogram's cumulative bucket counts on a /metrics page, by upper bound ("0.005", ..., "+Inf")."""
    counts = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            counts[le] = float(line.rsplit(" ", 1)[1])
    return counts


def quantile(buckets: dict[str, float], q: float) -> float:
    """A quantile of a cumulative histogram, linear within its bucket (as Prometheus's histogram_quantile)."""
    total = buckets.get("+Inf", 0.0)
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in sorted(((le, c) for le, c in buckets.items() if le != "+Inf"), key=lambda x: float(x[0])):
        upper = float(le)
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower  # beyond the last finite bucket: its bound (a floor)


def scrape(workers: Sequence[tuple[int, int]], audio_topic: str, t_s: float) -> MetricsSample | None:
    """One sample of a group of workers, given as (web port, pid), added up; None when one of them did not
    answer in time (a slow answer under load: the next sample will do)."""
    try:
        return MetricsSample.combined([parse_metrics(fetch_metrics(port), t_s, audio_topic, rss_bytes(pid))
                                       for port, pid in workers])
    except OSError:
        return None


def parse_metrics(text: str, t_s: float, audio_topic: str, rss: int = 0) -> MetricsSample:
    lag: int | None = None
    values = {QUEUE_DEPTH: 0.0, "callqa_active_calls": 0.0, "callqa_active_legs": 0.0}
    finals = batch_count = batch_sum = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CONSUMER_LAG and sample.labels.get("topic") == audio_topic:
                lag = (lag or 0) + int(sample.value)
            elif sample.name in values:
                values[sample.name] = sample.value
            elif sample.name == f"{FINALS}" and sample.labels.get("kind") == "final":
                finals = sample.value
            elif sample.name == f"{BATCH_SIZE}_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == f"{BATCH_SIZE}_count":
                batch_count = sample.value
            elif sample.name == f"{BATCH_SIZE}_sum":
                batch_sum = sample.value
    return MetricsSample(t_s, lag, values[QUEUE_DEPTH], values["callqa_active_calls"],
                         values["callqa_active_legs"], finals, buckets, batch_count, batch_sum, rss)


def histogram_between(first: MetricsSample, last: MetricsSample) -> dict[str, object]:
    """The ``callqa_batch_size`` histogram's observations between two scrapes: how many, their mean, and
    how many in each bucket ("1", "2", "3-4", ...: its upper bounds). The worker observes it once per final
    segment, with the size of the batch that segment was decoded in."""
    count = last.batch_count - first.batch_count
    histogram: dict[str, int] = {}
    below = lower = 0.0
    for bound in sorted(last.batch_buckets):
        cumulative = last.batch_buckets[bound] - first.batch_buckets.get(bound, 0.0)
        histogram[_bucket_label(lower, bound)] = int(round(cumulative - below))
        below, lower = cumulative, bound
    return {"observations": int(count),
            "mean": round((last.batch_sum - first.batch_sum) / count, 2) if count else None,
            "buckets": {k: v for k, v in histogram.items() if v}}


def _bucket_label(lower: float, upper: float) -> str:
    if upper == float("inf"):
        return f">{lower:g}"
    low = int(lower) + 1
    return f"{int(upper)}" if low >= upper else f"{low}-{int(upper)}"


# ---- the machine's arithmetic speed, measured in the same run ------------------------------------------
# Matrix products of the shapes tiny.en's layers multiply (d_model 384, feed-forward 1536): the encoder's
# feed-forward over a 30 s window (1500 frames), up and down, and a decoder step's over a batch of 16.
GEMM_SHAPES: tuple[tuple[int, int, int], ...] = ((1500, 384, 1536), (1500, 1536, 384), (16, 384, 1536))
# A machine of this much fp32 GEMM per core is the yardstick capacity is normalised to.
REFERENCE_GFLOPS_PER_CORE = 200.0

# Run in a child pinned to one core before numpy (and its BLAS pool) loads, with one BLAS thread: what one
# of the worker's cores multiplies, as taskset pins the worker. Prints the best seconds per product.
_GEMM_CHILD = """
import json, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import numpy as np
shapes, repeats, min_s = json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rng = np.random.default_rng(0)
best = []
for m, k, n in shapes:
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    np.matmul(a, b, out=out)
    t = time.perf_counter(); loops = 0
    while time.perf_counter() - t < min_s:
        np.matmul(a, b, out=out); loops += 1
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(loops):
            np.matmul(a, b, out=out)
        times.append((time.perf_counter() - t) / loops)
    best.append(min(times))
print(json.dumps(best))
"""
_ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


def gemm_gflops(shapes: Sequence[tuple[int, int, int]], seconds: Sequence[float]) -> float:
    """GFLOP/s of a set of products, each taking ``seconds`` (2·m·k·n flops each): all their flops over
    all their time, so a large product counts for what it costs."""
    if len(shapes) != len(seconds) or not shapes:
        raise ValueError("one time per shape, and at least one shape")
    if min(seconds) <= 0:
        raise ValueError(f"a product took no time: {list(seconds)}")
    flops = sum(2.0 * m * k * n for m, k, n in shapes)
    return flops / sum(seconds) / 1e9


def core_gemm_gflops(core: int, shapes: Sequence[tuple[int, int, int]] = GEMM_SHAPES, repeats: int = 5,
                     min_s: float = 0.05) -> float:
    """fp32 GEMM GFLOP/s of one core: numpy matmul, one BLAS thread, in a child pinned to ``core``, each
    product timed best of ``repeats`` runs of at least ``min_s``."""
    done = subprocess.run(  # noqa: S603 - this interpreter and our own code
        [sys.executable, "-c", _GEMM_CHILD, str(core), json.dumps([list(s) for s in shapes]), str(repeats),
         str(min_s)], capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **_ONE_THREAD})
    if done.returncode != 0:
        raise RuntimeError(f"the GEMM probe on core {core} failed: {done.stderr.strip()[-300:]}")
    return gemm_gflops(shapes, json.loads(done.stdout))


def machine_speed(cores: Sequence[int], shapes: Sequence[tuple[int, int, int]] = GEMM_SHAPES,
                  repeats: int = 5) -> dict[str, Any]:
    """fp32 GEMM GFLOP/s of each core in ``cores`` (one after the other), and their mean: the figure
    capacity is normalised by (``gemm_gflops_per_core``)."""
    per_core = {str(c): round(core_gemm_gflops(c, shapes, repeats), 1) for c in cores}
    return {"gemm_gflops_per_core": round(sum(per_core.values()) / len(per_core), 1),
            "gemm_gflops_by_core": per_core, "gemm_shapes_mkn": [list(s) for s in shapes],
            "gemm_method": f"numpy {_numpy_version()} fp32 matmul, one BLAS thread in a process pinned to each "
                           f"core in turn, best of {repeats}; GFLOP/s = all products' 2mkn / their time"}


def normalised_per_core(per_core: float, gemm_gflops_per_core: float | None,
                        reference: float = REFERENCE_GFLOPS_PER_CORE) -> float | None:
    """A per-core figure (legs, speech s/s) as on a machine of ``reference`` GFLOP/s per core: scaled by
    reference / the measured GEMM speed of the cores it ran on (None when that was not measured)."""
    if not gemm_gflops_per_core or gemm_gflops_per_core <= 0:
        return None
    return per_core * reference / gemm_gflops_per_core


def cpu_s_per_speech_s(cpu_s: float, speech_s: float) -> float | None:
    """CPU seconds a process spent per second of speech it decoded (None when it decoded none)."""
    return cpu_s / speech_s if speech_s > 0 else None


def _numpy_version() -> str:
    import numpy

    return str(numpy.__version__)


def mb(n: float) -> float:
    return round(n / 2**20, 1)
