"""Workers join and leave one consumer group during live calls: every call is finished exactly once.

Real broker, real worker processes, each with an embedded store of its own (as separate hosts have),
calls replayed in real time. A second worker starts ~10 s in, a third ~20 s in, and the first leaves (SIGTERM)
once both serve (30 s in at the earliest), while the calls (two library calls back to back, about two minutes
each) are still running: a worker's start on a 2-core machine busy with the rest of the suite took 40 s, and a
schedule by the clock alone let one-minute calls end before the first worker left. The stores are then read
together: each call has exactly one finished row over all of them, and its segments, counted by id
over all stores, are exactly the ones that row counts, with no speech stored twice under another id.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from pipeline.bench.stores import GroupStores
from pipeline.bench.workers import WorkerProcess
from pipeline.broker.producer import ContractProducer
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20, realtime=True, call_id_prefix="scale")
# Six library calls of about a minute, without holds; each test call is two of them back to back.
CALLS = ("01_address_change", "04_no_identity_check", "05_rude_agent", "06_agent_does_not_care",
         "07_escalation_manager", "17_overtalk")
JOIN_2_S, JOIN_3_S, LEAVE_S = 10.0, 20.0, 30.0


def wait_until(began: float, at_s: float) -> None:
    time.sleep(max(0.0, began + at_s - time.monotonic()))


def back_to_back(first: CallRecording, second: CallRecording) -> CallRecording:
    """One call of ``first`` then ``second`` (same legs, same rate, neither with holds)."""
    legs = {leg: np.concatenate([first.legs[leg], second.legs[leg]]) for leg in first.legs}
    call = CallRecording(source=f"{first.source}+{second.source}", legs=legs, sample_rate=first.sample_rate)
    call.encode(OPTIONS.encoding)
    return call


def start_in_background(start: Any) -> tuple[threading.Thread, list[Any]]:
    """Start a worker from a thread (its start waits for its web port): the replay's clock goes on."""
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
    singles = [load_recording(LIBRARY_DIR / f"{name}.wav", OPTIONS) for name in CALLS]
    recordings = [back_to_back(singles[i], singles[(i + 1) % len(singles)]) for i in range(len(singles))]
    first = start_group_worker()
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    call_ids: list[str] = []
    replay = threading.Thread(target=lambda: call_ids.extend(player.run(recordings, OPTIONS).call_ids))
    began = time.monotonic()
    replay.start()
    wait_until(began, JOIN_2_S)
    second_up, second_held = start_in_background(start_group_worker)
    wait_until(began, JOIN_3_S)
    third_up, third_held = start_in_background(start_group_worker)
    second_up.join()
    third_up.join()
    assert second_held and third_held, "a joining worker did not come up (its log is beside the test's)"
    second, third = second_held[0], third_held[0]
    wait_until(began, LEAVE_S)
    print(f"\nboth joined, the first leaves {time.monotonic() - began:.0f} s into the calls")
    replay_live_at_leave, first_alive_at_leave = replay.is_alive(), first.alive()
    first.stop()
    replay.join()
    assert first_alive_at_leave, f"the first worker died before it was stopped: {first.log_tail()}"
    assert replay_live_at_leave, "the calls ended before the first worker left: nothing was handed over live"

    stores = GroupStores([first, second, third])
    calls = stores.wait_finished(call_ids, timeout_s=240)

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
