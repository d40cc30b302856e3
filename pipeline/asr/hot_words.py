"""Hot words for Moonshine's greedy decoding (``CALLQA_HOT_WORDS``): a contact center's own
vocabulary (company, product and agent names) as a logit bonus, since Moonshine takes no previous-text
prompt to tell it.

Each phrase is tokenised as the decoder would emit it mid-sentence (``MoonshineTokenizer.encode``: each word
with its leading ``▁``), as written and with its first letter capitalised, and the token sequences go into
one trie. A row of the batch keeps its trie state: the hot-word prefixes its last tokens are inside. At each
step the tokens that start a hot word (but a one-letter one, see ``letter_start``) and the next token of
every prefix the row is inside get ``boost`` added to their log-probability before the greedy choice
(contextual biasing). A prefix the row leaves is dropped from its state, and the bonus only ever decides a
choice: the row's log-probability adds the model's own, unboosted, value of each chosen token, so a forced
hot word shows as a less confident text and no bonus stays behind in ``avg_logprob`` (or in the silence
rule that reads it).

The choice looks only at the boosted tokens besides the row's own argmax (the winner is either of them),
so a step adds a gather of a few columns, not a pass over the 32768 logits; the state is per row and
follows only that row's tokens, so a batched row decodes as it does alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.asr.moonshine_tokenizer import MoonshineTokenizer

State = tuple[int, ...]  # trie nodes (not the root) a row is inside, in the order they were entered
NO_STATE: State = ()


def hot_word_list(text: str) -> tuple[str, ...]:
    """``CALLQA_HOT_WORDS``: comma-separated words or phrases, whitespace collapsed, empties and repeats dropped."""
    phrases = (" ".join(p.split()) for p in text.split(","))
    return tuple(dict.fromkeys(p for p in phrases if p))


def forms(phrase: str) -> list[str]:
    """The forms a phrase is boosted in: as written, and with its first letter capitalised (a name at a
    sentence's start, or written lower case in the list)."""
    return list(dict.fromkeys([phrase, phrase[:1].upper() + phrase[1:]]))


def letter_start(piece: str) -> bool:
    """Whether a hot word's first piece is one letter after its ``▁`` ("Siobhan"'s ``▁S``, "Asterisk"'s
    ``▁A``), so not boosted: such a word is entered only when the model chooses that letter itself, and its
    later pieces are boosted then. A one-letter piece starts a large share of all words and every spelt
    letter: boosted, the model spelt other words through it (eval set, 16 kHz, boost 5: "Side left" ->
    "Sighed left.", "Eight of spades" -> "Ate of spades"; the Asterisk prompts, 8 kHz mu-law, at half the
    boost: 291 -> 294 word errors at 3 and 293 at 4, where a spelt "F" became "S" and "V" "Z"; with no
    bonus on them 291 at both)."""
    return len(piece.lstrip("\u2581")) <= 1


@dataclass(frozen=True)
class HotWords:
    """The token trie of a hot-word list; no per-decode state (several threads may decode with it)."""

    boost: float
    starts: np.ndarray  # tokens that start a hot word, boosted at every step (int64; no one-letter piece)
    sequences: tuple[tuple[int, ...], ...]  # each form's tokens
    children: tuple[dict[int, int], ...]  # node -> token -> child node; node 0 is the root
    follow: tuple[np.ndarray, ...]  # node -> the tokens of its children (int64)

    @classmethod
    def build(cls, phrases: Sequence[str], tokenizer: MoonshineTokenizer, boost: float) -> HotWords | None:
        """The trie of ``phrases``' forms; None for an empty list or no boost (decoding as without)."""
        sequences = [tuple(tokenizer.encode(form)) for phrase in phrases for form in forms(phrase)]
        sequences = list(dict.fromkeys(s for s in sequences if s))
        if not sequences or boost <= 0:
            return None
        children: list[dict[int, int]] = [{}]
        for sequence in sequences:
            node = 0
            for token in sequence:
                if token not in children[node]:
                    children.append({})
                    children[node][token] = len(children) - 1
                node = children[node][token]
        follow = tuple(np.array(list(c), np.int64) for c in children)
        starts = np.array([t for t in children[0] if not letter_start(tokenizer.piece_text(t))], np.int64)
        return cls(float(boost), starts, tuple(sequences), tuple(children), follow)

    def choose(self, logp: np.ndarray, states: Sequence[State]) -> np.ndarray:
        """Each row's greedy token once the hot-word tokens of its state are boosted: the argmax of
        ``logp`` plus ``boost`` on the starts and on the next token of each prefix the row is in (on a
        tie, the unboosted argmax). ``logp`` [rows, vocabulary], ``states`` one per row."""
        rows = np.arange(logp.shape[0])
        chosen = logp.argmax(axis=1)
        best = logp[rows, chosen]
        starts = self.starts
        if starts.size:  # none when every hot word starts with one letter
            boosted = logp[:, starts] + np.float32(self.boost)
            pick = boosted.argmax(axis=1)
            value = boosted[rows, pick]
            won = value > best
            chosen[won] = starts[pick[won]]
            best[won] = value[won]
        for row, state in enumerate(states):
            if not state:
                continue
            after = self.follow[state[0]] if len(state) == 1 else np.concatenate([self.follow[n] for n in state])
            values = logp[row, after] + np.float32(self.boost)
            at = int(values.argmax())
            if values[at] > best[row]:
                chosen[row], best[row] = after[at], values[at]
        return chosen

    def advance(self, state: State, token: int) -> State:
        """The prefixes a row is inside once it has emitted ``token``: each prefix it was in and that
        ``token`` continues, and a hot word ``token`` starts; a completed hot word with nothing longer
        after it, or a prefix ``token`` does not continue, is left."""
        entered: list[int] = []
        for node in (*state, 0):
            child = self.children[node].get(token)
            if child is not None and self.children[child] and child not in entered:
                entered.append(child)
        return tuple(entered)
