"""A `callqa desk` process for a benchmark, and a client of its live event stream that notes when each turn
reached it: what a browser on the wall or a call page would be sent, and when."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def start_desk(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """`callqa desk --port port` with ``env``, once it answers /health (RuntimeError naming its log if not)."""
    desk = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "desk", "--port", str(port)], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if desk.poll() is not None:
            raise RuntimeError(f"callqa desk exited ({desk.returncode}): see {log}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return desk
        except OSError:
            pass
        time.sleep(0.3)
    desk.kill()
    raise RuntimeError(f"callqa desk not serving after 90 s: see {log}")


class TurnStream(threading.Thread):
    """The stream of all calls' turns (``/api/live/events?kinds=turn``): ``on_turn(turn, received_s)`` for each,
    ``received_s`` the wall clock when its event was read. A stream the desk ends (its longest life) is opened
    again from the last event id, as a browser would."""

    def __init__(self, port: int, token: str, on_turn: Callable[[dict[str, Any], float], None]) -> None:
        super().__init__(daemon=True)
        self.port, self.token, self.on_turn = port, token, on_turn
        self.last_id = ""
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self._read()
            except OSError:
                self.stopped.wait(0.5)

    def _read(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        headers = {"Authorization": f"Bearer {self.token}", **({"Last-Event-ID": self.last_id} if self.last_id else {})}
        conn.request("GET", "/api/live/events?kinds=turn", headers=headers)
        response = conn.getresponse()
        event, data = "", ""
        while not self.stopped.is_set():
            line = response.readline()
            if not line:
                return
            text = line.decode().rstrip("\n")
            if text.startswith("id: "):
                self.last_id = text[4:]
            elif text.startswith("event: "):
                event = text[7:]
            elif text.startswith("data: "):
                data = text[6:]
            elif not text and data:
                if event in ("", "turn"):
                    turn = json.loads(data)
                    if "text" in turn:
                        self.on_turn(turn, time.time())
                event, data = "", ""
