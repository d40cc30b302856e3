"""Repeated client errors collapsed in the worker's log.

While the broker is down, aiokafka logs the same few errors (``Unable connect to node``, ``Unable to
update metadata``, ``Failed fetch messages``) on every retry: tens of thousands of lines per worker for a
restart of a minute, which bury everything else and fill disks. ``RepeatFilter`` lets one record per
logger and message template through every ``window_s``; the next one that passes says how many were
left out in between. Messages with different arguments (another node, another error) share a template,
so they count as repeats too: the first of each window shows them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# aiokafka's loggers (one per module, getLogger(__name__)) that log per retry.
CLIENT_LOGGERS = (
    "aiokafka.cluster", "aiokafka.conn", "aiokafka.consumer.consumer", "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator", "aiokafka.producer.producer", "aiokafka.producer.sender",
    "aiokafka.admin.client",
)
WINDOW_S = 10.0


class RepeatFilter(logging.Filter):
    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._left_out: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return False
        self._last[key] = now
        left_out = self._left_out.pop(key, 0)
        if left_out:
            record.msg = f"{record.msg} ({left_out} more like this in the last {self.window_s:.0f} s not logged)"
        return True


def collapse_client_repeats(window_s: float = WINDOW_S) -> None:
    """Attach one ``RepeatFilter`` to each of aiokafka's retrying loggers (idempotent)."""
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter(window_s))
