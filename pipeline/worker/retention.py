"""The worker's store sweeper: calls past ``retention_days_transcripts`` erased, recordings past
``retention_days_audio`` deleted, and erased calls whose rows came back erased again (pipeline/store/erasure.py).
Every worker sweeps; the erase is idempotent, so two at once only repeat a mutation that finds nothing."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from pipeline.config import Settings
from pipeline.recordings.storage import RecordingStore
from pipeline.store.client import connect
from pipeline.store.erasure import Erasure, sweep

log = logging.getLogger("callqa.worker")


def sweep_store(settings: Settings) -> list[Erasure]:
    """One sweep on a client of its own (the sink's stays the sink's)."""
    client = connect(settings.writer_url, settings.clickhouse_database, create_database=False, fresh=True)
    try:
        done = sweep(client, settings.clickhouse_database, settings.retention_days_transcripts,
                     retention_days_audio=settings.retention_days_audio,
                     remove_recording=RecordingStore(settings.recordings_location).delete)
    finally:
        client.close()
    if done.recordings_dropped:
        log.info("store sweep deleted %d recordings past %g days", done.recordings_dropped,
                 settings.retention_days_audio)
    return done.erased


async def sweep_now(settings: Settings) -> list[Erasure]:
    """A sweep off the event loop; a failure is logged (the next sweep tries again), never fatal."""
    try:
        done = await asyncio.to_thread(sweep_store, settings)
    except Exception as exc:  # noqa: BLE001 - the store may be away: the next interval retries
        log.warning("store sweep failed (retried in %.0f s): %s", settings.retention_sweep_interval_s,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return []
    if done:
        reasons = Counter(e.reason for e in done)
        log.info("store sweep erased %d calls (%s), %d rows", len(done),
                 ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())), sum(e.total for e in done))
    return done
