"""`callqa erase CALL_ID`: remove one call everywhere callqa keeps it, and say what was removed and what is left.

- Its redacted recording (pipeline/recordings), under ``recordings_location``, before its rows.
- The store: every row of the call, every table (pipeline/store/erasure.py), recorded in ``erasures``. Through the
  running worker's API when one holds the embedded store (``POST /api/calls/{id}/erasure``), else directly.
- The checkpoint topic (compacted): a tombstone for the call's key, so compaction drops its checkpoints (they hold
  the call's redacted text so far and its pre-roll audio).
- Static pages callqa wrote (``make demo``'s ``<state_dir>/demo/pages``): the call's page file.
- The other topics are keyed by call id but deleted by age, not by key (Kafka keeps a key's messages until the
  topic's retention passes): the report names each with the time its messages still live.

A call that has not ended is refused (its worker would write it again); ``force`` erases it anyway.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Settings
from pipeline.recordings.storage import RecordingStore
from pipeline.store.erasure import EraseError, erase_in_store


@dataclass(frozen=True)
class ErasureReport:
    call_id: str
    rows: dict[str, int]  # rows removed from the store per table
    outside: tuple[str, ...]  # what was done, or is left, outside the store: a line each


def tombstone_checkpoints(settings: Settings, call_id: str) -> str:
    """A tombstone for the call's key on the compacted checkpoint topic; a line saying what happened."""
    from confluent_kafka import Producer

    from pipeline.broker.security import kafka_config

    topic = settings.topic_checkpoints
    failures: list[str] = []
    producer = Producer({**kafka_config(settings), "message.timeout.ms": 10_000})
    producer.produce(topic, key=call_id.encode(), value=None,
                     on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
    left = producer.flush(15)
    if left or failures:
        return f"{topic}: the tombstone was not written ({failures[0] if failures else 'broker not reached'})"
    return f"{topic}: tombstone written; compaction drops the call's checkpoints"


def remove_page_files(settings: Settings, call_id: str) -> list[str]:
    """The call's static page under the folders callqa writes pages to; a line per file removed."""
    from pipeline.web.render import static_file_name

    removed = []
    for folder in (Path(settings.state_dir) / "demo" / "pages",):
        page = folder / "calls" / static_file_name(call_id)
        if page.exists():
            page.unlink()
            removed.append(f"{page}: removed (its list, {folder / 'index.html'}, names the call until written again)")
    return removed


def topics_left(settings: Settings) -> list[str]:
    """The delete-by-age topics that may still hold the call's messages, each with how long they live."""
    def days(ms: int) -> str:
        return "forever" if ms < 0 else f"{ms / 3_600_000:g} h" if ms < 86_400_000 else f"{ms / 86_400_000:g} d"

    kept = [(settings.topic_audio, settings.audio_retention_ms, "audio"),
            (settings.topic_transcripts, settings.output_retention_ms, "transcripts"),
            (settings.topic_qa, settings.output_retention_ms, "QA results"),
            (settings.topic_call_events, settings.output_retention_ms, "call events"),
            (settings.topic_latency, settings.output_retention_ms, "latency"),
            (settings.topic_postcall, settings.postcall_retention_ms, "post-call jobs"),
            (settings.topic_dead_letters, settings.dead_letter_retention_ms, "dead letters")]
    return [f"{topic}: its {what} of the call expire {days(ms)} after they were written (Kafka deletes by age)"
            for topic, ms, what in kept]


def erase_call(settings: Settings, call_id: str, erased_by: str, force: bool = False) -> ErasureReport:
    """Erase the call everywhere callqa keeps it (see the module's doc)."""
    from pipeline.report import WorkerApiError, running_worker
    from pipeline.store.client import connect

    # The store first: it refuses a live call, whose checkpoints must then stay.
    note = f"then a tombstone on {settings.topic_checkpoints} and the call's static pages removed"
    worker = running_worker(settings)
    if worker is not None:
        body = {"erased_by": erased_by, "force": force, "outside": note}
        try:
            rows = worker.send("POST", f"/api/calls/{urllib.parse.quote(call_id, safe='')}/erasure", body, 120)["rows"]
        except WorkerApiError as exc:
            raise EraseError(str(exc)) from None
    else:
        client = connect(settings.writer_url, settings.clickhouse_database)  # the process's client: left open
        rows = erase_in_store(client, settings.clickhouse_database, call_id, erased_by, force, note,
                              remove_recording=RecordingStore(settings.recordings_location).delete)
    outside = [tombstone_checkpoints(settings, call_id), *remove_page_files(settings, call_id)]
    return ErasureReport(call_id, {k: int(v) for k, v in rows.items()}, (*outside, *topics_left(settings)))
