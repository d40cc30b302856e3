"""A leg's previous text, which its next segment is decoded after (Whisper's <|startofprev|> prompt).

Whisper was trained on 30 s windows preceded by the text of the window before; faster-whisper keeps
that text as the prompt of the next window. A leg's segments are our windows, so a leg keeps the text of
its finals in order, and the decoder takes its last `context_tokens` tokens.

The known failure is a bad text dragging the ones after it (a hallucination or a loop repeated into
every later segment). So the context is dropped, not extended, when a final looks unreliable: its
average log-probability is below faster-whisper's -1.0 (faster-whisper resets its prompt when it had to
fall back to sampling, which the same threshold triggers), it is silence, or it is repetitive (the
compression-ratio check). It is dropped too after a long gap: text from minutes ago (before a hold)
says little about the next words, and a stale prompt can only mislead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline.asr.decoding import compression_ratio
from pipeline.asr.results import LOGPROB_THRESHOLD

CONTEXT_KEPT_TOKENS = 224  # more than any decoder takes (AsrSettings.context_tokens <= 200)


class DecodedText(Protocol):
    """What a final says about itself (TranscriptResult, the worker's Transcription)."""

    @property
    def text(self) -> str: ...

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def avg_logprob(self) -> float: ...

    @property
    def is_silence(self) -> bool: ...


@dataclass
class LegContext:
    """The tokens of a leg's recent finals, for the decoding of its next segment."""

    max_gap_ms: int = 30_000
    compression_ratio_max: float = 2.4
    tokens: tuple[int, ...] = ()
    end_ms: int | None = None

    def for_segment(self, start_ms: int) -> tuple[int, ...]:
        """The context of a segment that starts at ``start_ms`` (the leg's time): () after a long gap."""
        if self.end_ms is None or start_ms - self.end_ms > self.max_gap_ms:
            return ()
        return self.tokens

    def update(self, result: DecodedText, end_ms: int) -> None:
        """Follow on with the final of this leg's segment that ended at ``end_ms``, or start over if it
        looks unreliable. A final older than the last one taken (segments of a leg may be decoded in
        different batches and finish out of order) changes nothing."""
        if self.end_ms is not None and end_ms <= self.end_ms:
            return
        text = result.text.strip()
        self.end_ms = end_ms
        if not text or result.is_silence:
            return  # nothing said: the context before it stands (the gap check still applies)
        if result.avg_logprob < LOGPROB_THRESHOLD or self._repetitive(text):
            self.tokens = ()
            return
        self.tokens = (*self.tokens, *result.tokens)[-CONTEXT_KEPT_TOKENS:]

    def reset(self) -> None:
        self.tokens = ()
        self.end_ms = None

    def _repetitive(self, text: str) -> bool:
        return self.compression_ratio_max > 0 and compression_ratio(text) > self.compression_ratio_max
