"""The hidden-digit test through the running pipeline: a call in which a card number, its expiry and
security code, a date of birth and an address are spoken goes through the real broker and a real worker; its
kept recording, transcribed again, says none of them and still says the rest of the call; its stored transcript
says none of them either; the API serves the recording, and an erase removes it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.asr.engine import Engine
from pipeline.bench.workers import WorkerProcess
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings, get_settings
from pipeline.contracts import Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay
from pipeline.recordings.encode import decode_call
from pipeline.recordings.storage import RecordingStore
from tests.recordings.conftest import KEPT, hidden_digit_call, leaks

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _request(worker: WorkerProcess, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{worker.base_url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {worker.env['CALLQA_API_TOKEN']}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - the test's own worker
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_recording(worker: WorkerProcess, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.metric("callqa_recordings_total", outcome="written") < 1:
        if time.monotonic() > deadline or not worker.alive():
            raise TimeoutError(f"no recording written: {worker.log_tail()}")
        time.sleep(0.3)


def test_the_recording_of_the_hidden_digit_call_says_none_of_its_pii_and_the_rest_of_it(
        kafka_settings: Settings, start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> None:
    worker = start_worker(recordings="true")  # the default (conftest turns it off for the others)
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    (call_id,) = player.run([hidden_digit_call()], ReplayOptions(encoding="mulaw")).call_ids
    worker.wait_for_calls([call_id])
    _wait_recording(worker)

    stored = " ".join(r["text"] for r in worker.query(
        "SELECT text FROM segments_deduped WHERE call_id = {c:String} AND is_final = 1 ORDER BY start_ms", c=call_id))
    assert leaks(stored) == [], stored
    (row,) = worker.query("SELECT url, bytes, duration_ms, cuts FROM recordings FINAL WHERE call_id = {c:String}",
                          c=call_id)
    files = RecordingStore(str(tmp_path / "recordings"))
    data = files.read(call_id)
    assert row["bytes"] == len(data) and row["url"] == files.url_for(call_id)
    assert abs(row["duration_ms"] - 59_600) < 500 and len(data) < 59.6 * 4_000  # Opus: under 32 kbit/s
    kinds = {kind for cut in row["cuts"] for kind in cut["kind"].split(",")}
    assert kinds >= {"PAN", "CVV", "DOB", "ADDRESS"}, row["cuts"]
    print("\ncuts:", row["cuts"], "bytes:", len(data))

    legs, rate = decode_call(data)
    engine = Engine.load(settings=get_settings())
    heard = " ".join(r.text for leg in ("agent", "customer")
                     for r in engine.transcribe_segments(engine.leg_segments(legs[leg], rate))).lower()
    assert leaks(heard) == [], heard
    assert [k for k in KEPT if k not in heard] == [], heard

    status, served = _request(worker, "GET", f"/api/calls/{urllib.parse.quote(call_id)}/audio")
    assert (status, served) == (200, data)
    status, answer = _request(worker, "POST", f"/api/calls/{urllib.parse.quote(call_id)}/erasure", {"erased_by": "dpo"})
    assert status == 200 and json.loads(answer)["rows"]["recording_files"] == 1, answer
    assert not files.exists(call_id)
    assert _request(worker, "GET", f"/api/calls/{urllib.parse.quote(call_id)}/audio")[0] == 404
