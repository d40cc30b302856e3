"""Workers join and leave one consumer group during live calls: every call is finished exactly once.

Real broker, real worker processes, each with an embedded store of its own (as separate hosts have).
The first worker takes each call's first 20 s as a backlog; while the calls are open, two more workers
join, and once both serve the calls go on in real time and the first leaves (SIGTERM) 5 s later, ~35 s
before they end. The steps wait on events, not on the clock: on a 2-core machine busy with the rest
of the suite a worker's start took 40-80 s, and a schedule by the clock let the calls end before the
first worker left (or, with calls made longer to outlast it, gave the workers more audio than the
machine decoded in time). The stores are then read together: each call has exactly one finished row
over all of them, and its segments, counted by id over all stores, are exactly the ones that row
counts, with no speech stored twice under another id.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pipeline.bench.stores import GroupStores
from pipeline.bench.workers import WorkerProcess
from pipeline.broker.producer import ContractProducer
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import ReplayOptions, ReplayReport, TelephonyReplay, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20, call_id_prefix="scale")
# Six library calls of about a minute, without holds.
CALLS = ("01_address_change", "04_no_identity_check", "05_rude_agent", "06_agent_does_not_care",
         "07_escalation_manager", "17_overtalk")
BACKLOG_S = 20.0  # each call's first seconds, sent at once: the first worker has stored some before it leaves
LEAVE_AFTER_S = 5.0  # into the real-time part
JOIN_TIMEOUT_S = 240.0


def start_in_background(start: Any) -> tuple[threading.Thread, list[Any]]:
    """Start a worker from a thread (its start waits for its web port)."""
    holder: list[Any] = []
    thread = threading.Thread(target=lambda: holder.append(start()))
    thread.start()
    return thread, holder


def tracebacks(worker: WorkerProcess) -> list[str]:
    lines = worker.log_text().splitlines()
    return [" | ".join(lines[i:i + 12][-3:]) for i, line in enumerate(lines) if "Traceback" in line]


def test_workers_join_and_leave_during_live_calls_and_every_call_is_finished_once(
    kafka_settings: Any, start_group_worker: Any
) -> None:
    recordings = [load_recording(LIBRARY_DIR / f"{name}.wav", OPTIONS) for name in CALLS]
    first = start_group_worker()
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    backlog_sent, joined = threading.Event(), threading.Event()

    def hold_until_joined() -> None:  # the replay's real-time part waits for the joining workers
        backlog_sent.set()
        if not joined.wait(JOIN_TIMEOUT_S):
            raise RuntimeError("the joining workers did not come up")

    played: list[ReplayReport | BaseException] = []

    def play() -> None:
        try:
            played.append(player.run(recordings, OPTIONS, live_from_s=BACKLOG_S, on_live=hold_until_joined))
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread below
            played.append(exc)

    replay = threading.Thread(target=play)
    replay.start()
    assert backlog_sent.wait(120), f"the calls' first {BACKLOG_S:.0f} s did not reach the broker: {played}"
    second_up, second_held = start_in_background(start_group_worker)
    third_up, third_held = start_in_background(start_group_worker)
    second_up.join()
    third_up.join()
    joined.set()
    assert second_held and third_held, "a joining worker did not come up (its log is beside the test's)"
    second, third = second_held[0], third_held[0]
    time.sleep(LEAVE_AFTER_S)
    replay_live_at_leave, first_alive_at_leave = replay.is_alive(), first.alive()
    first.stop()
    replay.join()
    assert first_alive_at_leave, f"the first worker died before it was stopped: {first.log_tail()}"
    assert replay_live_at_leave, "the calls ended before the first worker left: nothing was handed over live"
    assert isinstance(played[0], ReplayReport), f"the replay failed: {played[0]!r}"
    call_ids = played[0].call_ids

    stores = GroupStores([first, second, third])
    calls = stores.wait_finished(call_ids, timeout_s=360, stall_s=120)

    assert first.exit_code == 0, f"the leaving worker exited with {first.exit_code}: {first.log_tail()}"
    for worker in (second, third):
        assert worker.alive(), f"{worker.log_path.name} died (exit {worker.exit_code}): {worker.log_tail()}"
    for worker in (first, second, third):
        assert tracebacks(worker) == [], f"{worker.log_path.name}: {tracebacks(worker)}"
    rows = {c: calls.finished[c] for c in call_ids}
    assert {c: len(r) for c, r in rows.items()} == {c: 1 for c in call_ids}, "a call finished more than once"
    assert {r[0]["end_reason"] for r in rows.values()} == {"end"}
    assert calls.inconsistencies(call_ids) == []
    assert all(calls.segments[c] for c in call_ids)
    # The point of the test: calls really moved between workers mid-call.
    moved = [c for c in call_ids if len(calls.stores_of[c]) > 1]
    assert moved, "no call's segments are in more than one store: no call changed worker mid-call"
    print(f"\n{len(call_ids)} calls, {sum(len(calls.segments[c]) for c in call_ids)} segments, "
          f"{len(moved)} calls handed over mid-call")
