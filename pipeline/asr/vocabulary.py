"""Whisper's byte-level BPE vocabulary: token ids to text, without the `tokenizers` package.

GPT-2 style byte-level BPE stores every byte as a printable unicode character (spaces become "Ġ"),
so decoding is: look each id up, map every character back to its byte, decode the bytes as UTF-8.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

END_OF_TEXT = 50256
START_OF_TRANSCRIPT = 50257
NO_SPEECH = 50361
NO_TIMESTAMPS = 50362


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class Vocabulary:
    """Token strings by id, as in CTranslate2's vocabulary.txt (one token per line)."""

    tokens: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        return cls(tuple(path.read_text(encoding="utf-8").split("\n")[:-1]))

    def __len__(self) -> int:
        return len(self.tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id >= END_OF_TEXT

    def decode(self, token_ids: list[int]) -> str:
        """Text of the ordinary (non-special) tokens, leading/trailing space removed."""
        table = _unicode_to_byte()
        data = bytearray()
        for token_id in token_ids:
            if self.is_special(token_id):
                continue
            data.extend(table[ch] for ch in self.tokens[token_id])
        return data.decode("utf-8", errors="replace").strip()
