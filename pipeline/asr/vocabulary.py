"""Whisper's byte-level BPE vocabulary: token ids to text, without the `tokenizers` package.

GPT-2 style byte-level BPE stores every byte as a printable unicode character (spaces become "Ġ"),
so decoding is: look each id up, map every character back to its byte, decode the bytes as UTF-8.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


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
class SpecialTokens:
    """Ids of Whisper's control tokens, looked up by name: English-only and multilingual vocabularies
    number them differently (tiny.en's <|endoftext|> is 50256, base's 50257)."""

    end_of_text: int
    start_of_transcript: int
    no_timestamps: int
    no_speech: int
    prompt: tuple[int, ...]  # <|startoftranscript|> first, then at least <|notimestamps|>
    always_suppressed: tuple[int, ...]
    start_of_prev: int | None = None  # <|startofprev|>: previous text follows it, before the prompt


def special_tokens(tokens: tuple[str, ...]) -> SpecialTokens:
    ids = {t: i for i, t in enumerate(tokens) if t.startswith("<|") and t.endswith("|>")}
    no_speech = ids.get("<|nospeech|>", ids.get("<|nocaptions|>"))
    if no_speech is None:
        raise KeyError("vocabulary has neither <|nospeech|> nor <|nocaptions|>")
    sot, no_ts = ids["<|startoftranscript|>"], ids["<|notimestamps|>"]
    multilingual = "<|en|>" in ids and "<|transcribe|>" in ids and len(tokens) >= 51865
    prompt = (sot, ids["<|en|>"], ids["<|transcribe|>"], no_ts) if multilingual else (sot, no_ts)
    # faster-whisper always suppresses these control tokens beside config.json's list.
    names = ("<|transcribe|>", "<|translate|>", "<|startoftranscript|>", "<|startofprev|>", "<|startoflm|>")
    suppressed = tuple(sorted({ids[n] for n in names if n in ids} | {no_speech}))
    return SpecialTokens(
        ids["<|endoftext|>"], sot, no_ts, no_speech, prompt, suppressed, ids.get("<|startofprev|>")
    )


@dataclass(frozen=True)
class Vocabulary:
    """Token strings by id, as in CTranslate2's vocabulary.txt (one token per line)."""

    tokens: tuple[str, ...]
    specials: SpecialTokens

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        tokens = tuple(path.read_text(encoding="utf-8").split("\n")[:-1])
        return cls(tokens, special_tokens(tokens))

    def __len__(self) -> int:
        return len(self.tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id >= self.specials.end_of_text

    def decode(self, token_ids: list[int]) -> str:
        """Text of the ordinary (non-special) tokens, leading/trailing space removed."""
        table = _unicode_to_byte()
        data = bytearray()
        for token_id in token_ids:
            if self.is_special(token_id):
                continue
            data.extend(table[ch] for ch in self.tokens[token_id])
        return data.decode("utf-8", errors="replace").strip()
