"""What both protocols share: the error that ends a session for bad input, with its websocket close code."""

from __future__ import annotations

from dataclasses import dataclass

# Websocket close codes (RFC 6455 7.4.1, and 4000-4999 for the application).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # gateway shutdown
CLOSE_UNSUPPORTED = 1003  # binary where text is expected, an audio format the gateway does not take
CLOSE_INVALID_DATA = 1007  # malformed JSON, bad base64, wrong field types
CLOSE_POLICY = 1008  # a message in the wrong state or order (media before start, wrong seq)
CLOSE_TOO_BIG = 1009  # one message of more than a second of audio
CLOSE_TRY_AGAIN = 1013  # a source over its per-source limits (pipeline/gateway/limits.py): try again later
CLOSE_IDLE = 4408  # nothing received for gateway_idle_timeout_s

MAX_FRAME_SAMPLES = 8000  # one second at 8 kHz: the longest audio one message may carry


@dataclass
class ProtocolError(Exception):
    """Bad input from the client: the session ends with ``code``; ``kind`` labels the counter, ``detail``
    is the log line's reason (never audio, never signalling values such as phone numbers)."""

    code: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.detail} (close {self.code})"
