"""`callqa bench check`: the long measurements that guard accuracy and churn, each against its limits.

The test suite runs a slice of each (a few prompts, legs or calls; a short churn run) with limits measured
on that slice, so it fails on the same defects in seconds; these run the whole thing: minutes each, about
40 minutes in all on 2 cores. The accuracy guards are pipeline/eval/guards.py's; the churn ones run the
chaos and scale-out scenarios (the broker they need is started by them: a private one for chaos). Run them when their code changes (`make bench-check`). Each check says
met / not met and why; the run writes ``check.json`` (the envelope of every result, then one entry per
check) and exits 1 when any check is not met.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import get_settings
from pipeline.eval.guards import GuardResult, Limit


@dataclass
class CheckRun:
    """What the checks share: one engine for the accuracy guards (loaded on first use), a work folder."""

    work: Path
    console: Console
    _engine: Any = field(default=None, repr=False)

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from pipeline.asr.engine import Engine

            self._engine = Engine.load()
        return self._engine


def _asterisk(run: CheckRun) -> GuardResult:
    from pipeline.eval.guards import asterisk_guard

    return asterisk_guard(engine=run.engine)


def _library_legs(run: CheckRun) -> GuardResult:
    from pipeline.eval.guards import library_legs_guard

    return library_legs_guard(engine=run.engine)


def _library_numbers(run: CheckRun) -> GuardResult:
    from pipeline.eval.call_library import number_utterances
    from pipeline.eval.guards import numbers_guard

    return numbers_guard(number_utterances(), engine=run.engine)


def _library_offline(run: CheckRun) -> GuardResult:
    from pipeline.eval.guards import library_offline_guard

    return library_offline_guard(engine=run.engine)


def _beam_reference(run: CheckRun) -> GuardResult:
    from pipeline.eval.guards import beam_reference_guard

    return beam_reference_guard()


# Eight calls of about a minute, without holds, most with PII spans (cards, SSN, e-mail, phone) for the scan.
CHAOS_CALLS = ("01_address_change", "02_card_payment", "10_double_five_card", "14_email_and_phone",
               "13_social_security", "11_amex_oh", "20_misheard_cvv", "12_card_with_pause")


def _churn(name: str, result: Any, plan: tuple[tuple[float, str], ...]) -> GuardResult:
    """A chaos run as a guard: every call finished once, with the offline finals and QA, no PII anywhere,
    and the planned faults really happened (counts)."""
    counts = result.counts()
    figures: dict[str, float | int | None] = {**counts, "problems": len(result.problems()),
                                              "unplanned_exits": len(result.unplanned_exits)}
    planned = {kind: sum(1 for _, f in plan if f == fault)
               for kind, fault in (("kills", "kill9"), ("sigterms", "sigterm"), ("broker_restarts", "broker"),
                                   ("outages", "store"))}
    limits = (Limit("problems", "<=", 0), Limit("unplanned_exits", "<=", 0),
              *(Limit(kind, ">=", n) for kind, n in planned.items() if n))
    return GuardResult(name, figures, limits, result.problems() + result.unplanned_exits)


def _chaos(run: CheckRun) -> GuardResult:
    """The chaos test's plan (pipeline/bench/chaos.py TEST_PLAN) over eight live calls 8 s apart."""
    from pipeline.bench.chaos import ChaosOptions, run_chaos

    options = ChaosOptions(work=run.work / "chaos", calls=len(CHAOS_CALLS), call_names=CHAOS_CALLS, call_every_s=8.0,
                           say=run.console.print)
    return _churn("chaos", run_chaos(options), options.plan)


def _library_live(run: CheckRun) -> GuardResult:
    """Every library call without holds, live through three workers with no fault: each finished once with
    the finals and QA of `callqa analyze` (which ``library-offline`` holds to the manifest), no PII anywhere."""
    from pipeline.bench.chaos import MAX_CALL_MS, ChaosOptions, run_chaos
    from pipeline.eval.call_library import load_manifest

    names = tuple(c["id"] for c in load_manifest()["calls"] if not c["holds"] and c["duration_ms"] <= MAX_CALL_MS)
    options = ChaosOptions(work=run.work / "library-live", calls=len(names), call_names=names, call_every_s=4.0,
                           plan=(), say=run.console.print)
    return _churn("library-live", run_chaos(options), options.plan)


def _long_call(run: CheckRun) -> GuardResult:
    """A 20-minute call replayed fast, its last 2 minutes live, the worker killed 20 s before its end and
    restarted: audio decoded again is at most one segment and one commit and checkpoint interval per leg."""
    from pipeline.bench.scale_out import part_crash

    part = part_crash(run.work / "long-call", call_s=1200.0, live_tail_s=120.0, kill_before_end_s=20.0)
    figures = {k: part[k] for k in ("call_s", "leg_audio_s", "redecoded_s", "bound_s")}
    figures["excess_s"] = round(part["redecoded_s"] - part["bound_s"], 1)
    return GuardResult("long-call", figures, (Limit("excess_s", "<=", 0),), [part["bound"]])


# name -> (what it measures, how); in the order they run (the quick ones first).
CHECKS: dict[str, tuple[str, Callable[[CheckRun], GuardResult]]] = {
    "library-numbers": ("digit sequences of the library's 23 spoken numbers", _library_numbers),
    "asterisk": ("WER and digit sequences, 551 Asterisk prompts through μ-law", _asterisk),
    "library-legs": ("WER of the library's 46 whole legs through μ-law", _library_legs),
    "library-offline": ("every library call through `callqa analyze` against its manifest", _library_offline),
    "beam-reference": ("beam 5 against faster-whisper's beam 5, the eval set in float32", _beam_reference),
    "long-call": ("a 20-minute call killed near its end: audio decoded again", _long_call),
    "chaos": ("eight live calls through kills, a SIGTERM, a broker restart and a store outage", _chaos),
    "library-live": ("every library call without holds live through three workers", _library_live),
}


@dataclass(frozen=True)
class CheckOptions:
    names: tuple[str, ...] = tuple(CHECKS)
    out: Path = RESULTS
    work: Path = Path(".callqa/bench-check")


def unknown_checks(names: tuple[str, ...]) -> str:
    """One line naming the names that are not checks, or "" when all are."""
    unknown = [n for n in names if n not in CHECKS]
    return f"unknown checks {', '.join(unknown)} (known: {', '.join(CHECKS)})" if unknown else ""


def run_checks(options: CheckOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """Every chosen check in turn (a check that raises is not met, with the error as its detail)."""
    problem = unknown_checks(options.names)
    if problem:
        raise ValueError(problem)
    run = CheckRun(options.work.resolve(), console)
    entries = []
    for name in options.names:
        what, check = CHECKS[name]
        began = time.monotonic()
        with console.status(f"{name}: {what}..."):
            try:
                result = check(run)
            except Exception as exc:  # noqa: BLE001 - one check failing to run must not hide the others' verdicts
                result = GuardResult(name, {}, (), error=f"{type(exc).__name__}: {exc}")
        entry = {**result.as_json(), "name": name, "what": what, "seconds": round(time.monotonic() - began, 1)}
        entries.append(entry)
        console.print(f"{name}: {'met' if entry['met'] else '[red]not met[/red]'} ({entry['seconds']:.0f} s)"
                      + "".join(f"\n  {line}" for line in entry["misses"]))
    doc = record("check", settings_that_matter(get_settings()),
                 {"met": all(e["met"] for e in entries), "checks": entries})
    return doc, write_result("check", doc, options.out)

