"""Moonshine's tokenizer: the ``tokenizer.bin`` its packages ship, read without the tokenizers package.

The file is the SentencePiece vocabulary in id order, each token as one length byte and that many bytes
of UTF-8 (the same pieces as the ``tokenizer.json`` of useful-moonshine-onnx): id 0 ``<unk>``, 1 ``<s>``
(the decoder's start token), 2 ``</s>`` (end), 3-258 the byte-fallback tokens, one raw byte each, then
the word pieces with ``▁`` (U+2581) for a leading space. tiny-en's file also lists the special tokens
``<<ST_0>>``... and one empty token up to the decoder's 32768 logits; base-en's stops at 32000.

``encode`` (hot words, ``hot_words.py``) is SentencePiece BPE as the vocabulary was trained: a word is
``▁`` and its characters, and the adjacent pair whose join is the lowest-id piece merges first (the file has
no scores; a BPE vocabulary lists its pieces in merge order, ids 259 on); a character with no piece falls
back to its UTF-8 byte tokens. It gives the tokens the decoder itself emits for the words it transcribes
(tests/asr/test_hot_words.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

UNK, START, END = 0, 1, 2
BYTE_TOKENS = range(3, 259)
SPACE = "\u2581".encode()


class TokenizerFormatError(ValueError):
    """tokenizer.bin is not a list of length-prefixed tokens."""


@dataclass(frozen=True)
class MoonshineTokenizer:
    pieces: tuple[bytes, ...]  # token id -> its UTF-8 bytes (a byte token: that one byte)

    @classmethod
    def load(cls, path: Path) -> MoonshineTokenizer:
        data = path.read_bytes()
        pieces: list[bytes] = []
        at = 0
        while at < len(data):
            length = data[at]
            if length >= 0x80 or at + 1 + length > len(data):
                raise TokenizerFormatError(f"{path}: token {len(pieces)} at byte {at} runs past the file")
            pieces.append(data[at + 1 : at + 1 + length])
            at += 1 + length
        if len(pieces) < 259 or pieces[START] != b"<s>" or pieces[END] != b"</s>":
            raise TokenizerFormatError(f"{path}: not a Moonshine tokenizer ({len(pieces)} tokens)")
        return cls(tuple(pieces))

    def __len__(self) -> int:
        return len(self.pieces)

    def never_said(self, logits: int) -> np.ndarray:
        """Token ids the decoder must not choose among `logits` outputs: unknown, start, the special
        ``<<...>>`` tokens, empty ones, and ids past the vocabulary."""
        ids = [UNK, START]
        ids += [i for i, p in enumerate(self.pieces) if i > END and (not p or (p.startswith(b"<<") and p.endswith(b">>")))]
        ids += range(len(self.pieces), logits)
        return np.array(sorted(set(ids)), np.int64)

    def piece_text(self, token: int) -> str:
        """A token as text, ``▁`` kept (byte tokens as the character they would start)."""
        return self.pieces[token].decode("utf-8", errors="replace") if token < len(self.pieces) else ""

    def encode(self, text: str) -> list[int]:
        """The pieces of ``text``, each word with its leading ``▁`` (a sentence's first word has one too)."""
        ids = self._piece_ids
        tokens: list[int] = []
        for word in text.split():
            symbols = ["\u2581", *word]
            while True:
                joins = [(ids[a + b], at) for at, (a, b) in enumerate(zip(symbols, symbols[1:], strict=False))
                         if a + b in ids]
                if not joins:
                    break
                at = min(joins)[1]
                symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
            for symbol in symbols:
                if symbol in ids:
                    tokens.append(ids[symbol])
                else:  # byte fallback
                    tokens += [BYTE_TOKENS.start + b for b in symbol.encode()]
        return tokens

    @cached_property
    def _piece_ids(self) -> dict[str, int]:
        """Piece text -> id, word pieces only (no special, byte or empty tokens)."""
        ids: dict[str, int] = {}
        for i, piece in enumerate(self.pieces):
            if i >= BYTE_TOKENS.stop and piece and not (piece.startswith(b"<<") and piece.endswith(b">>")):
                ids.setdefault(piece.decode("utf-8", errors="replace"), i)
        return ids

    def decode(self, tokens: Sequence[int]) -> str:
        raw = b"".join(self.pieces[t] for t in tokens if END < t < len(self.pieces))
        return raw.replace(SPACE, b" ").decode("utf-8", errors="replace").strip()
