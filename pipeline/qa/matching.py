"""Finding phrases in ASR text, exactly or tolerant to recognition errors.

Both modes compare normalised words (lower case, punctuation dropped, apostrophes kept inside words).
Exact: the phrase's words occur contiguously. Fuzzy: some window of the text's words (as long as the
phrase, or one word shorter or longer, so a split or merged word still aligns) is within a character
edit distance of the phrase: similarity = 1 - distance / max(len). ASR errors are mostly one short word
swapped ("the" for "a") or a few letters off ("trading" for "training"); character distance over the
joined window scores both proportionally, whereas word-level distance would punish a one-letter error
as much as a wrong word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def normalise_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def bigrams(words: list[str]) -> set[str]:
    text = " ".join(words)
    return {text[i : i + 2] for i in range(len(text) - 1)}


def bounded_edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of a and b, or limit + 1 as soon as it is known to exceed limit.

    Only a diagonal band of width 2*limit+1 can hold a path within the limit, so each row costs
    O(limit) instead of O(len(b)): this keeps fuzzy matching cheap enough to run on every live segment.
    """
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    big = limit + 1
    previous = [j if j <= limit else big for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        lo, hi = max(1, i - limit), min(len(b), i + limit)
        current = [big] * (len(b) + 1)
        current[0] = i if i <= limit else big
        char = a[i - 1]
        row_min = current[lo - 1]
        for j in range(lo, hi + 1):
            # Plain comparisons instead of min(): this loop is the hot path of live matching.
            best = previous[j - 1] if char == b[j - 1] else previous[j - 1] + 1
            if previous[j] + 1 < best:
                best = previous[j] + 1
            if current[j - 1] + 1 < best:
                best = current[j - 1] + 1
            current[j] = best
            if best < row_min:
                row_min = best
        if row_min > limit:
            return big
        previous = current
    return min(previous[len(b)], big)


def shared_bigrams(target: str, text_bigrams: set[str]) -> int:
    """How many of target's bigram positions have their bigram somewhere in text_bigrams."""
    return sum(1 for i in range(len(target) - 1) if target[i : i + 2] in text_bigrams)


@dataclass(frozen=True)
class PhraseMatch:
    phrase: str
    matched: str
    word_index: int
    word_count: int
    similarity: float


@dataclass(frozen=True)
class Phrase:
    """One phrase of a rule, normalised once at load."""

    text: str
    words: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Phrase:
        return cls(text=text, words=tuple(normalise_words(text)))

    @property
    def joined(self) -> str:
        return " ".join(self.words)

    def find_exact(self, words: list[str]) -> PhraseMatch | None:
        n = len(self.words)
        for i in range(len(words) - n + 1):
            if tuple(words[i : i + n]) == self.words:
                return PhraseMatch(self.text, self.joined, i, n, 1.0)
        return None

    def could_match(self, text_bigrams: set[str], threshold: float) -> bool:
        """Cheap necessary condition for a fuzzy match anywhere in a text with these character bigrams.

        Each edit destroys at most two of the phrase's bigrams, so a match within k edits keeps at least
        len-1-2k of them, and all of those occur in the text. Most phrases fail this on most segments,
        which spares the edit-distance windows.
        """
        target = self.joined
        # A matching window is at most len/threshold long, which bounds the edits it may take.
        limit = int((1.0 - threshold) * len(target) / threshold)
        return shared_bigrams(target, text_bigrams) >= len(target) - 1 - 2 * limit

    def find_fuzzy(
        self, words: list[str], threshold: float, text_bigrams: set[str] | None = None
    ) -> PhraseMatch | None:
        """Best window of words whose similarity to the phrase is at least threshold."""
        exact = self.find_exact(words)
        if exact is not None:
            return exact
        if text_bigrams is not None and not self.could_match(text_bigrams, threshold):
            return None
        target = self.joined
        best: PhraseMatch | None = None
        n = len(self.words)
        for size in {max(1, n - 1), n, n + 1}:
            for i in range(len(words) - size + 1):
                window = " ".join(words[i : i + size])
                longest = max(len(window), len(target))
                limit = int((1.0 - threshold) * longest)
                if abs(len(window) - len(target)) > limit:
                    continue
                window_bigrams = {window[k : k + 2] for k in range(len(window) - 1)}
                if shared_bigrams(target, window_bigrams) < len(target) - 1 - 2 * limit:
                    continue
                distance = bounded_edit_distance(window, target, limit)
                if distance > limit:
                    continue
                similarity = 1.0 - distance / longest
                if best is None or similarity > best.similarity:
                    best = PhraseMatch(self.text, window, i, size, similarity)
        return best
