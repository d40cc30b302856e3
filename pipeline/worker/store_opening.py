"""The worker's store, opened and migrated on a thread of its own.

A standby taking over its instance used to open the store before joining the group, and the embedded
engine's start (0.4 s on a fresh folder, 2.6 s after 20 minutes of a soak's inserts: it loads every part
of every table) was most of a restart's pause. Now the join, the checkpoint reads and the live path go on
meanwhile; the sink's first insert waits for the opening (``ready``), and an opening that fails makes the
worker unhealthy, so it exits with the reason in one line, as a store that dies does. A first start still
waits for it before anything (``wait``): a store it cannot use stops it at once.
"""

from __future__ import annotations

import threading

from clickhouse_connect.driver.client import Client

from pipeline.config import Settings
from pipeline.store.client import connect, connect_when_free
from pipeline.store.migrations import migrate

# Longest a standby waits for its predecessor's embedded store to close (it closes within a second).
STORE_HANDOVER_WAIT_S = 10.0


class StoreOpening:
    """Opens and migrates the writer's store once, on a thread; a ``Component`` of the worker's health."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, name="store-opening", daemon=True)
        self._thread.start()

    @property
    def error(self) -> BaseException | None:
        """Why the store could not be opened or migrated (None while opening, and once it is)."""
        return self._error

    def wait(self) -> None:
        """Until the store is open and migrated; raises what stopped that."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    def writer_client(self) -> Client:
        """A new client of the sink's (it owns and closes it), once the store is ready."""
        self.wait()
        # create_database=False: the migrations made it; an insert-only account could not.
        return connect(self.settings.writer_url, self.settings.clickhouse_database, create_database=False,
                       fresh=True)

    def _open(self) -> None:
        try:
            # A standby taking over may find its predecessor's embedded engine still closing.
            client = connect_when_free(self.settings.writer_url, self.settings.clickhouse_database,
                                       STORE_HANDOVER_WAIT_S)
            migrate(client, self.settings.clickhouse_database)
        except BaseException as exc:  # noqa: BLE001 - reported through error / wait
            self._error = exc
        finally:
            self._done.set()
