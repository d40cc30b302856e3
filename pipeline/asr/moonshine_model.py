"""A built Moonshine model loaded into ONNX Runtime, and its batched greedy decoding.

Moonshine takes 16 kHz float audio as it is (no mel features, no 30 s window: the encoder's cost follows
the audio's length). Its merged decoder carries a KV cache: the first step runs with
``use_cache_branch=False`` and empty past tensors and computes the cross-attention keys/values from the
encoder states; every later step feeds the previous step's ``present.*`` back with
``use_cache_branch=True`` and one new token per row. Start token 1 (``<s>``), end token 2 (``</s>``).

Batching: the decoder steps of a batch's segments run as one batch, the encoder states zero-padded to the
longest and masked by ``encoder_attention_mask`` (added by the build, see ``moonshine_graphs``): a row's
logits are bit-identical to its own, so batched text equals one-by-one text. Each segment is encoded
alone: base-en's encoder has no mask, and tiny-en's does not isolate a row (1 s of masked zeros after a
1.3 s utterance moves its states by up to 0.58; both normalise over the whole time axis after the first
convolution), so only equal lengths could share an encoder run, which VAD segments never have. The
encoder's cost follows the audio, so little is lost. A row that has ended leaves the batch, so the
others' steps get cheaper.

Hot words (``MoonshineOptions.hot_words``, ``hot_words.py``): a row's trie state follows its own tokens
only, so a batched row still decodes as it does alone; with no hot words the step is as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline.asr.decoding import NumberTokens, WindowPolicy, compression_ratio, cut_loop, ends_in_loop
from pipeline.asr.hot_words import NO_STATE, HotWords, State
from pipeline.asr.manifest import Manifest
from pipeline.asr.moonshine_tokenizer import END, START, MoonshineTokenizer
from pipeline.asr.signing import load_trusted_manifest

CROSS_MASK = "encoder_attention_mask"  # the decoder's [B, S] input, 1 = an encoder frame of audio
MIN_SAMPLES = 1600  # 0.1 s: the encoder's strided convolutions need it; shorter audio is zero-padded


@dataclass(frozen=True)
class MoonshineOptions:
    # Only for the batcher, which batches segments of one length bucket first (less padding).
    window: WindowPolicy = field(default_factory=lambda: WindowPolicy(5.0))
    # Moonshine's own generation cap is 6 tokens per second of audio; the allowance covers short
    # segments (a one-word answer of 0.3 s is still 2-3 tokens).
    max_tokens_per_second: float = 6.5
    token_allowance: int = 4
    max_new_tokens: int = 224
    loop_copies: int = 3  # three back-to-back copies of a 2+ token block stop the row (cut to one copy)
    compression_ratio_max: float = 2.4  # 0 = off: text above it is cut to its loop's first copy
    # Silence appended to every segment before the encoder: Moonshine drops or garbles the last word of
    # audio that stops right after it (a VAD segment keeps 150 ms after speech). The token cap follows
    # the segment's own length, not the padded one.
    tail_pad_s: float = 0.0
    # Words or phrases boosted in the greedy choice (hot_words.py; CALLQA_HOT_WORDS), and the bonus added
    # to their tokens' log-probabilities; no words: the decode is as without.
    hot_words: tuple[str, ...] = ()
    hot_word_boost: float = 0.0

    def token_cap(self, duration_s: float) -> int:
        return min(self.max_new_tokens, self.token_allowance + math.ceil(self.max_tokens_per_second * duration_s))


@dataclass(frozen=True)
class MoonshineDecoded:
    tokens: list[int]
    text: str
    avg_logprob: float
    # Moonshine has no no-speech token: the probability it gives ``</s>`` as the first token (nothing
    # said; then suppressed there) stands in for Whisper's no-speech probability in the silence rule.
    no_speech_prob: float
    stopped_by_guard: bool


FinalRow = Callable[[int, MoonshineDecoded], None]


@dataclass
class MoonshineOnnx:
    """Encoder + merged decoder sessions of one built Moonshine version."""

    manifest: Manifest
    folder: Path
    quantization: str
    tokenizer: MoonshineTokenizer
    encoder: ort.InferenceSession
    decoder: ort.InferenceSession

    @property
    def label(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}/{self.quantization}"

    @classmethod
    def load(
        cls, folder: Path, quantization: str = "fp32", intra_op_threads: int = 1,
        trusted_key: Ed25519PublicKey | None = None,
    ) -> MoonshineOnnx:
        """Load a model folder after checking its files' sha256s (and the signature, given a key)."""
        manifest, graphs = load_trusted_manifest(folder, quantization, trusted_key)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_cpu_mem_arena = False  # shapes change every call (see WhisperOnnx.load)
        providers = ["CPUExecutionProvider"]
        return cls(
            manifest=manifest,
            folder=folder,
            quantization=quantization,
            tokenizer=MoonshineTokenizer.load(folder / manifest.vocabulary_file),
            encoder=ort.InferenceSession(str(folder / graphs["encoder"]), options, providers=providers),
            decoder=ort.InferenceSession(str(folder / graphs["decoder"]), options, providers=providers),
        )

    @classmethod
    def shipped(cls, like: MoonshineOnnx, encoder: Path, decoder: Path, intra_op_threads: int = 1) -> MoonshineOnnx:
        """The package's own ``.ort`` graphs in place of a built folder's (benchmarks: what the build saves),
        with ONNX Runtime's default memory arena, which spares base-en's per-run weight casts an
        allocation each (without it they cost over 3x more)."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        return cls(like.manifest, like.folder, "shipped", like.tokenizer,
                   ort.InferenceSession(str(encoder), options, providers=providers),
                   ort.InferenceSession(str(decoder), options, providers=providers))

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """One segment's 16 kHz samples -> encoder states [S, D]."""
        if audio.size < MIN_SAMPLES:
            audio = np.pad(audio, (0, MIN_SAMPLES - audio.size))
        feed = {"input_values": np.ascontiguousarray(audio, np.float32)[None]}
        if "attention_mask" in self._encoder_inputs:
            feed["attention_mask"] = np.ones((1, audio.size), np.int64)
        return self.encoder.run(None, feed)[0][0]

    @property
    def _encoder_inputs(self) -> set[str]:
        return {i.name for i in self.encoder.get_inputs()}

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """(layers, heads, head_dim) of the decoder's KV cache."""
        past = [i for i in self.decoder.get_inputs() if i.name.startswith("past_key_values.")]
        return len(past) // 4, int(past[0].shape[1]), int(past[0].shape[3])

    @property
    def vocab_logits(self) -> int:
        return int(self.decoder.get_outputs()[0].shape[2])


class MoonshineDecoder:
    """Greedy decoding of batches of segments; keeps no per-batch state (several threads may decode)."""

    def __init__(self, model: MoonshineOnnx, options: MoonshineOptions) -> None:
        self.model = model
        self.options = options
        self.layers, self.heads, self.head_dim = model.cache_shape
        self._bias = np.zeros(model.vocab_logits, np.float32)
        self._bias[model.tokenizer.never_said(model.vocab_logits)] = -np.inf
        self._bias_begin = np.zeros_like(self._bias)
        self._bias_begin[END] = -np.inf
        self.hot_words = HotWords.build(options.hot_words, model.tokenizer, options.hot_word_boost)
        pieces = [model.tokenizer.piece_text(i).replace("\u2581", "\u0120") for i in range(len(model.tokenizer))]
        self.numbers = NumberTokens.of(pieces)
        self._past_names = [f"past_key_values.{layer}.{part}.{kv}" for layer in range(self.layers)
                            for part in ("decoder", "encoder") for kv in ("key", "value")]
        self._outputs = [o.name for o in model.decoder.get_outputs()]
        # The shipped base-en decoder (loaded straight from the package, to time it) takes no mask: its rows
        # are decoded one at a time. Every built folder's decoder takes one.
        self._masked = CROSS_MASK in {i.name for i in model.decoder.get_inputs()}

    def decode(self, audios: Sequence[np.ndarray], on_final: FinalRow | None = None) -> list[MoonshineDecoded]:
        """Each segment's text; ``on_final`` hears of each row as soon as it has ended."""
        if not audios:
            return []
        if not self._masked and len(audios) > 1:
            return [d for row, a in enumerate(audios) for d in self.decode([a], _renumbered(on_final, row))]
        pad = np.zeros(round(self.options.tail_pad_s * 16000), np.float32)
        states = [self.model.encode(np.concatenate([a, pad]) if pad.size else a) for a in audios]
        durations = [a.size / 16000 for a in audios]
        longest = max(s.shape[0] for s in states)
        hidden = np.zeros((len(states), longest, states[0].shape[1]), np.float32)
        mask = np.zeros((len(states), longest), np.int64)
        for row, s in enumerate(states):
            hidden[row, : s.shape[0]] = s
            mask[row, : s.shape[0]] = 1
        return self._generate(hidden, mask, durations, on_final)

    def _generate(self, hidden: np.ndarray, mask: np.ndarray, durations: list[float],
                  on_final: FinalRow | None) -> list[MoonshineDecoded]:
        batch = hidden.shape[0]
        caps = [self.options.token_cap(d) for d in durations]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[float] = [0.0] * batch
        no_speech = [0.0] * batch
        results: list[MoonshineDecoded | None] = [None] * batch
        hot = self.hot_words
        hot_states: list[State] = [NO_STATE] * batch  # each row's hot-word prefixes
        live = list(range(batch))  # batch rows still decoding, in the order of the tensors' rows
        empty = np.zeros((batch, self.heads, 0, self.head_dim), np.float32)
        past: dict[str, np.ndarray] = dict.fromkeys(self._past_names, empty)
        ids = np.full((batch, 1), START, np.int64)
        first = True
        while live:
            feed = {"input_ids": ids, "encoder_hidden_states": hidden,
                    "use_cache_branch": np.array([not first]), **past}
            if self._masked:
                feed[CROSS_MASK] = mask
            outputs = dict(zip(self._outputs, self.model.decoder.run(self._outputs, feed), strict=True))
            logits = outputs["logits"][:, -1, :] + self._bias
            if first:
                # As Whisper's no-speech probability (its <|nospeech|> at the start): how sure the model
                # is that nothing is said. Then </s> is suppressed on the first token, as Whisper
                # suppresses <|endoftext|> there: an empty text for real speech (a short "two nine three
                # four zero" in 8 kHz μ-law) is worse than a low-confidence text the silence rule drops.
                no_speech_now = np.exp(_log_softmax(logits)[:, END])
                logits = logits + self._bias_begin
            logp = _log_softmax(logits)
            # The token is chosen with the hot words' bonus; its log-probability (below) is the model's own.
            chosen = logp.argmax(axis=1) if hot is None else hot.choose(logp, [hot_states[row] for row in live])
            keep: list[int] = []
            for i, row in enumerate(live):
                token = int(chosen[i])
                logprobs[row] += float(logp[i, token])
                if first:
                    no_speech[row] = float(no_speech_now[i])
                if token == END:
                    results[row] = self._finish(tokens[row], logprobs[row], len(tokens[row]) + 1, no_speech[row], False)
                else:
                    tokens[row].append(token)
                    if hot is not None:
                        hot_states[row] = hot.advance(hot_states[row], token)
                    if len(tokens[row]) >= caps[row] or ends_in_loop(tokens[row], self.options.loop_copies,
                                                                     numbers=self.numbers):
                        results[row] = self._finish(tokens[row], logprobs[row], len(tokens[row]), no_speech[row], True)
                    else:
                        keep.append(i)
                        continue
                if on_final is not None:
                    on_final(row, results[row])  # type: ignore[arg-type]
            if not keep:
                break
            index = np.array(keep)
            # The cache branch returns placeholders for the cross-attention cache: the first step's
            # keys/values of the encoder states are kept and fed again.
            past = {
                name: outputs["present" + name[len("past_key_values"):]] if first or ".decoder." in name else past[name]
                for name in self._past_names
            }
            if len(keep) < len(live):  # rows that ended leave the batch
                past = {name: value[index] for name, value in past.items()}
                hidden, mask = hidden[index], mask[index]
            ids = chosen[index][:, None].astype(np.int64)
            live = [live[i] for i in keep]
            first = False
        return [r for r in results if r is not None]

    def _finish(self, tokens: list[int], logprob: float, count: int, no_speech: float,
                stopped: bool) -> MoonshineDecoded:
        text = self.model.tokenizer.decode(tokens)
        limit = self.options.compression_ratio_max
        if stopped or (limit > 0 and compression_ratio(text) > limit):
            cut = cut_loop(tokens, numbers=self.numbers)
            if cut != tokens:
                tokens, stopped = cut, True
                text = self.model.tokenizer.decode(tokens)
        return MoonshineDecoded(list(tokens), text, logprob / max(1, count), no_speech, stopped)



def _log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def _renumbered(on_final: FinalRow | None, row: int) -> FinalRow | None:
    """``on_final`` for a one-row decode that is the batch's row ``row``."""
    if on_final is None:
        return None
    return lambda _, decoded: on_final(row, decoded)
