"""Chaos, short: live calls through 3 workers while workers are killed (-9) and stopped (SIGTERM), the broker
is restarted and the store refuses writes for 12 s; every call must come out as the offline analysis says.

Real processes throughout: a Kafka broker of the test's own (it is restarted, which the session's shared
broker must not be), three `callqa worker` processes of one group with embedded stores of their own, four
library calls replayed in real time 10 s apart (live from 0 to about 90 s). Every kind of fault, once or
twice, while calls are live (``PLAN``): kill -9 at 12 s; SIGTERM at 20 s; inserts refused from 28 s for 12 s,
and on until every worker's sink has had one refused; the broker restarted at 40 s; kill -9 at 52 s, once the
group's peers can evict its victim (inside the outage when it still lasts: a take-over that must replay what
the store refused). Each killed or stopped worker is restarted at once, in the background: the faults keep
their times however long a restart takes. The SIGTERM comes before the outage: a clean stop during one waits
out the sink's close (38 s seen; tests/worker/test_store_outage.py covers that case), and the broker restart,
which waits for a stop under way, then pushed the last kill past the calls' end (seen on a fresh clone). A
broker restart itself takes 20-40 s on a loaded 2-core machine: the last kill comes after it.
`callqa bench check` (``chaos``) runs the longer plan (eight calls, ``TEST_PLAN``) and
`callqa bench chaos` a plan of any length.

Checked against an independent reference, `callqa analyze` of the same recordings: each call's finals over
all stores are the offline ones (leg, bounds, text), each stored once; each call is finished in one store,
by its end event, with the offline QA (score, items, events, metrics) in the store and in every QA result
on the topic; no PII span of the library's manifest in any topic (call checkpoints included), any table or
any worker log. About two minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pipeline.bench.chaos import ChaosOptions, ChaosResult, run_chaos
from pipeline.bench.tables import show

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# Calls of about a minute without holds, with PII spans (cards, SSN, e-mail, phone) for the scan.
CALLS = ("02_card_payment", "14_email_and_phone", "13_social_security", "12_card_with_pause")
PLAN = ((12.0, "kill9"), (20.0, "sigterm"), (28.0, "store"), (40.0, "broker"), (52.0, "kill9"))


def explain(result: ChaosResult, figures: dict[str, Any], work: Path) -> None:
    """What a failed run's workers said of each call with a problem, and each worker life's frame counts:
    CI keeps only the output, and the logs of a failed run are gone with its temporary folder."""
    for life in figures["worker_lives"]:
        print(f"  life {life}")
    for call in sorted({p.split(":")[0] for p in result.problems() if p.split(":")[0] in result.call_ids}):
        for log in sorted(work.glob("worker*.log")):
            lines = [line[:200] for line in log.read_text(errors="replace").splitlines() if call in line]
            print(f"  {log.name}, lines naming {call}: {' | '.join(lines[-10:]) or '-'}")


def test_live_calls_survive_kills_a_sigterm_a_broker_restart_and_a_store_outage(tmp_path: Path) -> None:
    # Six calls (the four cycled), so calls are still live when the last kill comes late: a fault waits for a
    # worker's clean stop to end (38 s in a store outage) and for the group to settle after the broker's
    # restart, and with four the last kill once found every call ended ("a fault hit an idle worker").
    result = run_chaos(ChaosOptions(work=tmp_path / "chaos", calls=len(CALLS) + 2, call_names=CALLS,
                                    call_every_s=10.0, plan=PLAN, outage_s=12.0, budget_s=520.0))
    figures = result.figures()
    show(figures, Console(), "chaos")
    for line in result.unplanned_exits + result.problems():
        print(f"  {line}")

    # Each fault did what it is for, on workers that held live calls: the kills killed, the broker's restart
    # was seen by the workers, the store really refused inserts.
    counts = result.counts()
    assert [f["exit_code"] for f in result.faults if f["kind"] == "kill9"] == [-9, -9], result.faults
    assert result.broker_refusals_logged > 0, "no worker logged a refused broker connection: the restart was not seen"
    worker_faults = [f for f in result.faults if f["kind"] in ("kill9", "sigterm")]
    assert all(f["active_calls"] > 0 for f in worker_faults), f"a fault hit an idle worker: {worker_faults}"
    assert [f["exit_code"] for f in result.faults if f["kind"] == "sigterm"] == [0], "SIGTERM: not a clean exit"
    assert result.fault_log_lines > 0, "no worker logged a refused insert: the outage did not reach the sink"
    outages = [f for f in result.faults if f["kind"] == "store"]
    assert all(f.get("outage_reached") for f in outages), f"the outage reached no worker's sink: {outages}"
    # Each worker killed while its peers could evict it (group stable, every peer watching it) was evicted by
    # one, not left to its session; none that was stopped. A kill while a peer restarted or the coordinator
    # loaded after the broker's restart is left to the session timeout, rightly, and is not counted.
    evictable = [f for f in result.faults if f["kind"] == "kill9" and f.get("evictable")]
    assert evictable, f"no kill came while the group could evict its victim: {result.faults}"
    assert len(evictable) <= result.evictions_logged <= counts["kills"], (
        f"{result.evictions_logged} evictions for {counts['kills']} kills, {len(evictable)} of them evictable")
    # Every call finished once, with the offline finals and QA; no PII anywhere.
    # Short on purpose: CI shows the end of the output, and a full diff of 60 problems pushed the printed
    # summary and problem lines (the run's own account, above) out of it.
    problems = result.problems()
    if problems:
        explain(result, figures, tmp_path / "chaos")
    assert not problems, f"{len(problems)} problems (all printed above); first: {problems[:3]}"
    assert result.scanned["messages"] > 0 and result.scanned["rows"] > 0 and result.scanned["log lines"] > 0
