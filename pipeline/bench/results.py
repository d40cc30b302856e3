"""Every benchmark's result file: one JSON document per run, the figures beside what they depend on.

Each run records the machine (CPU model, family, the vector extensions the kernels use, cores, memory),
the git commit (and whether the working tree had uncommitted changes), when it started (UTC), the
settings that change the figures, then the benchmark's own figures. ``<out>/<name>.json`` holds the
latest run (indented, for reading and diffs); ``<out>/<name>.jsonl`` gets one line per run, oldest
first: the history a README table can cite by the run's ``started`` stamp.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.config import Settings
from pipeline.config.asr import AsrSettings
from pipeline.config.segmentation import SegmentationSettings

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# The keys every run's document starts with; write_result refuses a document without them.
ENVELOPE = ("benchmark", "started", "machine", "git", "settings")

# CPU features that decide which ONNX Runtime kernels run (vector width, FMA, int8 and bf16 dot products):
# the flags summary. The full flag list is long and says nothing more about these figures.
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve")

# Settings that change the figures: every decoding and segmentation setting, and the worker's batching,
# polling and partitioning. Paths and keys are left out (they name files, not behaviour).
_NOT_BEHAVIOUR = {"models_dir", "vad_model_path", "model_public_key"}
SETTINGS_THAT_MATTER = (
    *(name for name in AsrSettings.model_fields if name not in _NOT_BEHAVIOUR),
    *(name for name in SegmentationSettings.model_fields if name not in _NOT_BEHAVIOUR),
    "frame_batch_max", "frame_batch_within_ms", "max_poll_records", "audio_partitions", "partial_interval_ms",
    "early_decode", "max_inflight_audio_mb", "commit_interval_s", "malloc_mmap_threshold_bytes",
)


@dataclass(frozen=True)
class Machine:
    """What the figures were measured on."""

    cpu_model: str  # e.g. "AMD EPYC 9B14"; a VM may say less
    cpu_vendor: str  # e.g. AuthenticAMD, GenuineIntel (x86), or the ARM implementer
    cpu_family: str  # the x86 family number (25: Zen 3/4, 6: Intel Core/Xeon) or the ARM architecture
    cpu_model_number: str
    cpu_flags: list[str]  # the KERNEL_FLAGS present
    cores: int
    cores_available: int  # this process's affinity: what an unpinned run may use
    memory_gb: float
    platform: str
    python: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def machine() -> dict[str, Any]:
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return Machine(
        cpu_model=info.get("model name") or platform.processor() or platform.machine(),
        cpu_vendor=info.get("vendor_id") or info.get("CPU implementer", ""),
        cpu_family=info.get("cpu family") or info.get("CPU architecture", ""),
        cpu_model_number=info.get("model") or info.get("CPU part", ""),
        cpu_flags=[f for f in KERNEL_FLAGS if f in flags],
        cores=os.cpu_count() or 1,
        cores_available=len(os.sched_getaffinity(0)),
        memory_gb=_memory_gb(),
        platform=platform.platform(),
        python=platform.python_version(),
    ).as_json()


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if fields:
                    break  # the first processor is enough: they are all the same CPU
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def _memory_gb() -> float:
    with suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)  # kB
    return 0.0


def git_commit() -> dict[str, Any]:
    """The checked-out commit and whether tracked files had uncommitted changes (figures of dirty trees
    are still figures, but of code no commit holds)."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603,S607
        except OSError:
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def settings_that_matter(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in SETTINGS_THAT_MATTER if hasattr(settings, name)}


def utc_stamp() -> str:
    """When a run started, as its documents and history lines name it: 20261201T081045Z."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def run_folder(name: str, stamp: str | None = None) -> Path:
    """Where a run keeps what its errors point to (worker and gateway logs): ``<state_dir>/bench/<name>-<stamp>``
    (default: now), left in place after the run (stores and broker data in it are removed unless kept)."""
    return Settings().state_dir / "bench" / f"{name}-{stamp or utc_stamp()}"


def record(name: str, settings: Mapping[str, Any], figures: Mapping[str, Any], *,
           started: str | None = None, machine_measured: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A run's document: the envelope (benchmark, started, machine, git, settings), then its figures.
    ``machine_measured``: what the run measured of the machine itself (e.g. ``gemm_gflops_per_core``,
    probes.machine_speed), added to ``machine``."""
    clash = set(ENVELOPE) & set(figures)
    if clash:
        raise ValueError(f"figures of {name!r} use the envelope's keys {sorted(clash)}")
    return {"benchmark": f"callqa bench {name}", "started": started or utc_stamp(),
            "machine": {**machine(), **(machine_measured or {})}, "git": git_commit(), "settings": dict(settings),
            **figures}


def write_result(name: str, doc: Mapping[str, Any], out: Path = RESULTS) -> list[Path]:
    """``doc`` as ``out/<name>.json`` (the latest run) and one more line of ``out/<name>.jsonl``."""
    missing = [key for key in ENVELOPE if key not in doc]
    if missing:
        raise ValueError(f"a {name!r} result without {', '.join(missing)}: build it with record()")
    out.mkdir(parents=True, exist_ok=True)
    latest, history = out / f"{name}.json", out / f"{name}.jsonl"
    partial = latest.with_suffix(".json.tmp")  # a reader never sees half a file
    partial.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    partial.replace(latest)
    with history.open("a") as lines:
        lines.write(json.dumps(doc, separators=(",", ":"), default=float) + "\n")
    return [latest, history]


def read_history(name: str, out: Path = RESULTS) -> list[dict[str, Any]]:
    """Every run of a benchmark, oldest first."""
    path = out / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
