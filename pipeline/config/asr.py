"""Settings of the ASR engine: model, front end, segmentation, batcher, decoding."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class AsrSettings(BaseModel):
    # The live transcript drives the alerts and, without the post-call pass, the QA record. On 8 kHz
    # mu-law (`callqa bench accuracy`, bench/results/postcall): Asterisk prompts 8.6 -> 5.5 % WER, library number
    # clips 39.2 -> 26.3 %, the eval set 4.3 -> 5.1 % (117 words: one word); a held-out real set of 212 words
    # 9.9 -> 5.7 %. bench live, 10 calls on 2 pinned cores (bench/results/defaults): 1.16x tiny.en's
    # worker CPU per speech second in the same 200 ms messages (inference 1.26x). Its cost is latency: a long turn
    # decodes slower, and P99 <= 1.5 s held 6 calls (bench/results/capacity) where tiny.en held 11. tiny.en stays
    # selectable (and is what the test suite's workers run: tests/conftest.py).
    model: str = Field(
        "moonshine-base",
        description="Model to build and load: Moonshine moonshine-base (default) or moonshine-tiny (greedy only; no "
        "previous-text context), or Whisper tiny.en or base.",
    )
    # The post-call pass: the call's segments decoded again by a more accurate model, QA scored on
    # that transcript and kept as the call's revision 1 beside the live result: the worker's pass
    # (pipeline/postcall, settings in config/postcall.py), `callqa analyze` and `callqa retranscribe`.
    # Empty: no second pass.
    # A job is kept only where the pass measures better than the live record. Live is moonshine-base, and
    # no other shipped model does better on `callqa bench accuracy` (8 kHz mu-law WER, bench/results/postcall:
    # faster-whisper beam 5 Asterisk 6.3 against 5.5 %, library legs 10.6 against 4.3 %; tiny.en, moonshine-tiny
    # worse on both), so it is off; the live model named again would only decode the same text twice (refused:
    # ``post_call_model``). It serves a cheaper live model, e.g. CALLQA_MODEL=tiny.en with moonshine-base here.
    final_model: str = Field(
        "", description="Model of the post-call pass (e.g. moonshine-base behind a tiny.en live pass); empty, or the "
        "live model itself: no pass, the live transcript is final.",
    )

    @property
    def post_call_model(self) -> str:
        """The post-call pass's model: ``final_model``, unless it is the live model (the same text again)."""
        return "" if self.final_model == self.model else self.final_model
    # Moonshine garbles or drops the last word of audio that stops right after it. 1 s of silence after
    # each segment (8 kHz mu-law, moonshine-base, `callqa bench accuracy`): Asterisk prompts 7.5 -> 5.5 %
    # WER, number clips 31.6 -> 26.3 %, eval unchanged, library legs 4.15 -> 4.26 %; 0.5 s: 5.8 / 30.4 %.
    moonshine_tail_pad_ms: int = Field(
        1000, ge=0, le=5000, description="Silence (ms) appended to each segment before Moonshine's encoder (Whisper: unused).",
    )
    # Moonshine takes no previous-text prompt, so a contact center's own vocabulary (company, product
    # and agent names) is boosted in its greedy choice instead (pipeline/asr/hot_words.py: each phrase's tokens
    # in a trie, a bonus on the tokens that start one and on the next token of a prefix a row is inside).
    # Measured with moonshine-base on 8 kHz mu-law (pipeline/asr/README.md): the call library's 36 turns that
    # name its brand, agents and customers (727 words), those names listed, 12 -> 6 word errors ("Harbour
    # Mutual" -> "Harbor Mutual", "Linda Cartier" -> "Carter", "May Pole Street" -> "Maple Street", "Marita" ->
    # "Maria"). Empty: the decode is exactly as without. Whisper: unused (its prompt is context_tokens).
    hot_words: str = Field(
        "",
        description="Moonshine hot words: comma-separated words or short phrases (company, product, agent names) "
        "whose tokens get hot_word_boost in the greedy choice; empty = off (Whisper: unused).",
    )
    # 3 (moonshine-base, int8row-decoder, 8 kHz mu-law): the lowest boost that made every library fix above (1-2
    # mended "Harbour" but not "Marita"). 18 names absent from the eval set changed none of its 20 texts up to 6
    # (16 kHz too; at 8, 6 -> 15 of 117 word errors); on the 551 Asterisk prompts (3259 words) 291 -> 291 word
    # errors at 3 and 4, 294 at 5, where one-word prompts turned into listed names ("Console" -> "Contoso").
    hot_word_boost: float = Field(
        3.0, ge=0.0, le=20.0,
        description="Log-probability bonus of a hot word's tokens in Moonshine's greedy choice (0 = off); the "
        "recorded log-probability stays the model's own.",
    )
    models_dir: str = Field("models", description="Where built ONNX models live (models/<name>/<version>/).")
    # auto = fp32 for Whisper: int8's dynamic quantization scales activations over the whole batch, so a
    # segment's text changed with the segments it was batched with; fp32 gives the same text alone or
    # batched (a replay after a crash, or `callqa transcribe`, reproduces the stream), and a lower WER
    # on 8 kHz mu-law (4.3 % vs 6.8 %), for ~19 % less pipeline throughput (callqa bench end-to-end);
    # int8row kept tiny.en's eval WER but lost on library-numbers.
    # auto = int8row-decoder for Moonshine: its decoder step at batch 1 reads every weight once
    # (166 MB in fp32) and is bound by memory: 8-bit weights take a base-en step from 17.8 to 9.0 ms (one
    # pinned core; six 4-12 s call segments alone 3.10 -> 2.11 s, the same text). The encoder is bound by
    # arithmetic: int8row there bought 1.3 -> 1.2 s, and together with the decoder's it made the library's
    # 16-digit test card number loop (library-numbers 8k mu-law 26.3 -> 30.4 % WER, that one utterance).
    # The decoder alone, word errors at 8 kHz mu-law (fp32 -> int8row-decoder, the worker's path): eval 6 -> 6
    # of 117, Asterisk 181 -> 180 of 3286, library legs 201 -> 199 of 4719, library numbers 45 -> 44 of 171.
    # Batch independence is as fp32's up to a last token: 8-bit rounding can turn fp32's last-bit difference
    # over a padded batch into a trailing full stop (1 of 20 eval rows; tests/asr/test_moonshine.py).
    quantization: Literal["auto", "fp32", "int8", "int8row", "int8row-decoder"] = Field(
        "auto", description="ONNX graph variant: auto (int8row-decoder for Moonshine, fp32 for Whisper), fp32 "
        "(batch-independent, matches faster-whisper fp32), int8 (faster; text depends on the batch), int8row "
        "(8-bit weights, per-row int8 activations: batch-independent) or int8row-decoder (fp32 encoder, int8row "
        "decoder); the int8row kinds need a model folder built since they were added.",
    )

    def graphs_for(self, family: str) -> str:
        """The graph variant ``quantization`` picks for a model family (``whisper`` or ``moonshine``)."""
        if self.quantization != "auto":
            return self.quantization
        return "int8row-decoder" if family == "moonshine" else "fp32"

    # 5 s with fp32: same WER as 10 s on the eval set (6.8/4.3/4.3 %), 14.4 vs 12.1 audio s per s.
    window_bucket_s: float = Field(
        5.0, description="Encoder window: segment length rounded up to this many seconds (0 = Whisper's 30 s)."
    )
    max_tokens_per_second: float = Field(
        5.0, description="Cap on decoded tokens per second of audio (plus a small allowance): stops run-on loops."
    )
    full_window_retry: bool = Field(
        True, description="Decode again in the full 30 s window a segment that hit the token cap or looped."
    )
    compression_ratio_max: float = Field(
        2.4, ge=0.0,
        description="A decoded text whose zlib compression ratio is above this is repetitive and decoded again in the longer windows (faster-whisper's 2.4; 0 = off).",
    )
    min_tokens_per_second: float = Field(
        1.5, ge=0.0,
        description="A segment of 6 s or more whose text ends with fewer tokens per second than this ended early at a pause; it is decoded again in the 30 s window (0 = off).",
    )
    retry_whole_twice: bool = Field(
        True,
        description="A segment whose whole text is one phrase said twice (\"1 1\") in a short window is decoded again in the 30 s window.",
    )
    retry_logprob: float = Field(
        -1.0, le=0.0,
        description="A segment whose text's average log-probability is below this in a short window is decoded again in the 30 s window (faster-whisper's fallback threshold, -1.0; -1e9 = off).",
    )
    context_tokens: int = Field(
        0, ge=0, le=200,
        description="Decode each segment after the last this-many text tokens of its leg's previous final text (Whisper's previous-text prompt; 0 = no context).",
    )
    beam_size: int = Field(
        1, ge=1, le=10,
        description="Hypotheses kept per segment: 1 = greedy; 5 = beam search as faster-whisper's default (each hypothesis is a decoder row: about beam-size times the decoding cost).",
    )
    retry_window_bucket_s: float = Field(
        10.0, ge=0.0,
        description="Bucket of the first, cheaper retry window (s) before the full 30 s one (0 = straight to 30 s).",
    )
    max_batch: int = Field(16, description="Most segments decoded together in one batch.")
    max_wait_ms: float = Field(30.0, description="Longest a segment waits in the batcher for others to join it (ms).")
    # Which waiting segments the next batch takes when more than max_batch wait (pipeline/asr/batcher.py's
    # take_batch; its docstring says why "shortest").
    batch_order: Literal["oldest", "shortest"] = Field(
        "shortest",
        description="Segments a batch takes first when more than max_batch wait: shortest (shortest window first, "
        "a short reply not held behind a long turn; see batch_age_limit_ms) or oldest (the oldest's window bucket "
        "first, then by age).",
    )
    batch_age_limit_ms: float = Field(
        1000.0, ge=0.0,
        description="With batch_order=shortest: a segment that has waited this long (ms) goes before any younger "
        "one, so long turns are not starved under load (0 = oldest first, like a FIFO).",
    )
    # pipeline/asr/batcher.py (its docstring): a short reply batched with a long turn waits for the long
    # window's encode and decodes beside it. On by default: bench live on 2 pinned cores, against off in
    # the same runs (bench/results/scheduling/), CPU per speech second 0.989x / 0.939x / 0.955x at 14 / 20 / 24
    # calls, P99 1.74 -> 1.66 s, 2.19 -> 2.27 s, 6.77 -> 5.07 s (and at 24 calls the input kept up, where off fell behind).
    batch_one_window: bool = Field(
        True,
        description="A batch takes only segments of one window bucket (its first segment's); the others wait for "
        "the next free inference thread or process.",
    )
    # Moonshine encodes a batch's rows one after another (its encoder has no mask) and only its decoder steps are
    # shared, so four segments in one decoding process while the other stood idle took 0.9-1.0 s where two and two
    # take about half (the slowest finals of bench live at 12 calls, bench/results/long-turns). bench live, 12 calls
    # on 2 pinned cores, against off in the same run (bench/results/batch-spread): P99 1.02 -> 0.86 s, P50 0.65 ->
    # 0.62 s, worker CPU per speech second 0.88x.
    batch_spread: bool = Field(
        True,
        description="Segments waiting when several inference threads or processes are free are shared out among "
        "them (a batch takes its share, rounded up) instead of all going to the first.",
    )
    # A partial re-decodes its leg's open segment; one that waited this long behind finals is out of date (the leg's
    # next one, a partial interval later, supersedes it), so under load partials are dropped, not decoded late.
    preview_max_wait_ms: float = Field(
        1000.0,
        description="A partial transcript (a preview) that has waited this long for a decoding thread is dropped "
        "undecoded; 0: never dropped. Previews always give way to finals (see pipeline/asr/batcher.py).",
    )
    batcher_queue_size: int = Field(256, description="Segments queued in the batcher before submit() waits.")
    intra_op_threads: int = Field(
        1, description="ONNX Runtime intra-op threads per session (0 = all cores); 1 leaves a core to the agents.",
    )
    # pipeline/asr/blas_threads.py: OpenBLAS's spare threads spin after every call. bench live at 11 calls on
    # 2 cores (run 20261203T080505Z): worker CPU per speech second 0.0769 at 1, 0.0895 at 0 (1.16x; P99 1.13 / 1.47 s).
    blas_threads: int = Field(
        1, ge=0,
        description="numpy BLAS threads in a process that decodes (the worker in-process, each decoding process): "
        "the log-mel's one matmul per segment needs no more, and idle OpenBLAS threads spin (0 = leave it to the "
        "library: OPENBLAS_NUM_THREADS, or one per core).",
    )
    # 1: on 2 cores, 2 threads made batches smaller (1.2 vs 2.6 segments) without more inference CPU
    # (the decode loop's Python and the event loop share the GIL): 10 calls, P99 14.0 s against 6.3 s
    # (bench/results/live.jsonl, runs 20261130T225858Z and T230226Z). Try it with more cores.
    inference_threads: int = Field(
        1, ge=0, description="Batches decoded at once, one thread each (0 = one per core the process may use).",
    )
    # The decode loop's Python holds the GIL, so a second inference thread could not run beside
    # the event loop. N > 0: each batch is decoded by one of N child processes (pipeline/asr/
    # inference_process.py: audio through shared memory, results back per row over a pipe), and the
    # batcher runs N batches at once (inference_threads is then N). Figures: pipeline/asr/README.md.
    # Auto = 2 on 2+ cores: bench live --search on 2 pinned cores (bench/results/capacity) held
    # 10 calls in-process and 20+ with two children (P99 1.27 s at 20); at 10 calls P99 1.12 against 1.37 s and
    # CPU per speech second 0.89x. Each child holds its own model (~500 MB for tiny.en fp32).
    inference_processes: int = Field(
        -1, ge=-1, le=16,
        description="Child processes that decode the batcher's batches, one batch each at a time, off the worker's GIL: "
        "-1 = auto (2 when the worker may use 2 or more cores, else 0), 0 = in the worker's own inference threads.",
    )
    # A full 30 s window (the last retry of a looping row, a turn of 25-30 s) in a batch that runs while
    # no other segment waits encodes on more threads: bit-identical output, 677 -> 386 ms on 2 cores.
    # Every idle batch doing so was worse (10 calls on 2 cores: P99 6.32 -> 8.42 s: most batches start
    # with the queue empty, and the second thread took 0.24 cores from the event loop); 30 s windows are
    # rare (2-3 % of call-library turns loop into one) and were the slowest finals at 1-2 calls.
    idle_encoder_threads: int = Field(
        0, ge=0, description="Encoder threads for a full 30 s window nothing else waits behind (1 = off, 0 = every core the worker may use).",
    )
    # Not a secret (it only verifies), so a plain string: the key itself, or where to read it.
    model_public_key: str = Field(
        "", description="Ed25519 key trusted to sign model manifests (file path or base64); set = signatures required.",
    )
    model_canary: bool = Field(
        True, description="Transcribe the shipped canary utterance before a model takes traffic (start, hot swap).",
    )
    model_canary_max_wer: float = Field(
        0.2, ge=0.0, description="Highest WER on the canary utterance a model may show and still be used.",
    )
