"""The live desk of one process: its board, the follower that fills it, and the streams it serves.

``callqa desk`` follows the topics from its start to its end (``always``). A worker's desk starts following on
the first live request and stops once nobody has asked for ``live_idle_stop_s`` and no stream is open: a
worker nobody watches reads nothing for it. A desk that starts again begins a new board (a new epoch: the
streams of the old one get the snapshot again, nothing in between is missed).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from pipeline.config import Settings
from pipeline.live.board import LiveBoard
from pipeline.live.follower import LiveFollower


class LiveDesk:
    def __init__(self, settings: Settings, always: bool = False) -> None:
        self.settings = settings
        self.always = always
        self.board = self._new_board()
        self.follower: LiveFollower | None = None
        self.streams = 0
        self.streams_by_source: Counter[str] = Counter()
        self._last_use = time.monotonic()

    def _new_board(self) -> LiveBoard:
        return LiveBoard(self.settings.live_event_buffer, round(self.settings.live_ended_keep_s * 1000))

    def touch(self) -> LiveBoard:
        """A live request: the board, following the topics from now on if it was not (on the running loop)."""
        self._last_use = time.monotonic()
        if self.follower is None or not self.follower.running:
            if self.follower is not None:  # stopped: what came meanwhile was not read
                self.board.close()
                self.board = self._new_board()
            self.follower = LiveFollower(self.settings, self.board)
            self.follower.start(asyncio.get_running_loop())
        return self.board

    async def stop_if_idle(self) -> bool:
        """A worker's timer: stop following when nobody has looked for a while. Returns whether it stopped."""
        idle = time.monotonic() - self._last_use
        if self.always or self.streams or self.follower is None or idle < self.settings.live_idle_stop_s:
            return False
        follower, self.follower = self.follower, None
        await asyncio.to_thread(follower.stop)
        self.board.close()
        self.board = self._new_board()
        return True

    async def close(self) -> None:
        """The process stops: streams end now (a browser reconnects to another desk), the follower after."""
        self.board.close()
        if self.follower is not None:
            await asyncio.to_thread(self.follower.stop)
            self.follower = None
