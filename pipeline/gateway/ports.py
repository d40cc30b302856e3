"""What the gateway's core hands its output to: frames and call lifecycle, with no Kafka in sight.

``outbox.Outbox`` implements both for the server (bounded buffers, then Kafka); tests use
``RecordingSink``-style fakes that keep what they were given.
"""

from __future__ import annotations

from typing import Protocol

from pipeline.contracts.messages import AudioFrame, CallEvent


class FrameSink(Protocol):
    def frame(self, frame: AudioFrame) -> None:
        """Take one frame; never waits (a full leg buffer drops its oldest frame instead)."""

    def buffered_fraction(self, call_id: str) -> float:
        """How full the call's fullest leg buffer is (0..1): AudioHook sessions pause near 1."""


class CallLifecycleSink(Protocol):
    def call_started(self, event: CallEvent) -> None:
        """The call's start event (sent before any of its frames)."""

    def call_ended(self, event: CallEvent) -> None:
        """The call's end event (sent after all of its frames)."""

    def call_held(self, call_id: str, at_ms: int) -> None:
        """The client paused the call's audio (a PCI pause: card details being read out), at call time
        ``at_ms``."""

    def call_resumed(self, call_id: str, at_ms: int, held_ms: int) -> None:
        """The client's pause ended at call time ``at_ms``, ``held_ms`` after it began."""

    def call_paused(self, call_id: str, at_ms: int) -> None:
        """An operator paused the call's capture (secure pause, ``pause.py``) at call time ``at_ms``: its audio
        is dropped here until the capture resumes."""

    def call_unpaused(self, call_id: str, at_ms: int, paused_ms: int, reason: str | None = None) -> None:
        """The secure pause ended at call time ``at_ms``, ``paused_ms`` after it began; ``reason`` when nobody
        asked (the call ended while paused)."""


class CallSink(FrameSink, CallLifecycleSink, Protocol):
    """Everything the core sends out."""
