"""A built Whisper model loaded into ONNX Runtime: verified files, encoder and decoder-step sessions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline.asr.manifest import (
    Manifest,
    latest_model_folder,
)
from pipeline.asr.signing import load_trusted_manifest
from pipeline.asr.vocabulary import Vocabulary


@dataclass
class WhisperOnnx:
    """Encoder + decoder-step sessions of one built model version."""

    manifest: Manifest
    folder: Path
    quantization: str
    vocabulary: Vocabulary
    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    # The same encoder on more threads, for a batch that runs while nothing else waits (see
    # ``encode(wide=True)``); None: never. Its outputs are bit-identical to ``encoder``'s (ONNX Runtime
    # splits the work by output blocks, each summed in the same order), so text does not depend on it.
    encoder_wide: ort.InferenceSession | None = None

    @property
    def label(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}/{self.quantization}"

    @classmethod
    def load(
        cls,
        folder: Path,
        quantization: str = "int8",
        intra_op_threads: int = 0,
        trusted_key: Ed25519PublicKey | None = None,
        wide_encoder_threads: int = 1,
    ) -> WhisperOnnx:
        """Load a model folder after checking every file it needs against the manifest's sha256, and,
        when `trusted_key` is given, the manifest's signature by that key."""
        manifest, graphs = load_trusted_manifest(folder, quantization, trusted_key)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Batch and window shapes vary on every call, so the arena keeps growing to the largest seen:
        # measured 965 MB peak RSS with it, 645 MB without, at the same CPU time (batch 16, tiny.en int8).
        options.enable_cpu_mem_arena = False
        providers = ["CPUExecutionProvider"]
        encoder_wide = None
        if wide_encoder_threads > max(1, intra_op_threads):
            wide = ort.SessionOptions()
            wide.intra_op_num_threads = wide_encoder_threads
            wide.inter_op_num_threads = 1
            wide.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            wide.enable_cpu_mem_arena = False
            # Its threads sleep between runs: spinning ones would take the cores the event loop needs.
            wide.add_session_config_entry("session.intra_op.allow_spinning", "0")
            encoder_wide = ort.InferenceSession(str(folder / graphs["encoder"]), wide, providers=providers)
        return cls(
            manifest=manifest,
            folder=folder,
            quantization=quantization,
            vocabulary=Vocabulary.load(folder / manifest.vocabulary_file),
            encoder=ort.InferenceSession(str(folder / graphs["encoder"]), options, providers=providers),
            decoder=ort.InferenceSession(str(folder / graphs["decoder"]), options, providers=providers),
            encoder_wide=encoder_wide,
        )

    @classmethod
    def load_latest(
        cls,
        models_dir: Path,
        name: str,
        quantization: str,
        intra_op_threads: int = 0,
        trusted_key: Ed25519PublicKey | None = None,
    ) -> WhisperOnnx:
        return cls.load(latest_model_folder(models_dir, name), quantization, intra_op_threads, trusted_key)

    @property
    def decoder_layers(self) -> int:
        return sum(1 for i in self.encoder.get_outputs() if i.name.startswith("cross_k_"))

    def encode(self, mel: np.ndarray, wide: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """mel [B, n_mels, T] -> per decoder layer, cross-attention keys and values [B, H, T/2, Dh].
        ``wide``: on the wide encoder's threads when there is one (the same numbers, sooner)."""
        session = self.encoder_wide if wide and self.encoder_wide is not None else self.encoder
        outputs = session.run(None, {"mel": np.ascontiguousarray(mel, dtype=np.float32)})
        named = dict(zip((o.name for o in self.encoder.get_outputs()), outputs, strict=True))
        return [
            (named[f"cross_k_{layer}"], named[f"cross_v_{layer}"]) for layer in range(self.decoder_layers)
        ]

    def decode_step(self, inputs: DecoderStepInputs) -> DecoderStepOutputs:
        """One decoder step for the whole batch: the greedy token (and the `top_k` best) per row, and the grown cache."""
        feed: dict[str, np.ndarray] = {
            "tokens": inputs.tokens.astype(np.int64),
            "positions": inputs.positions.astype(np.int64),
            "cross_mask": inputs.cross_mask,
            "self_mask": inputs.self_mask,
            "logit_bias": inputs.logit_bias,
            "no_speech_id": np.array([inputs.no_speech_id], np.int64),
            "top_k": np.array([inputs.top_k], np.int64),
        }
        for layer, ((past_k, past_v), (cross_k, cross_v)) in enumerate(
            zip(inputs.past, inputs.cross, strict=True)
        ):
            feed |= {f"past_k_{layer}": past_k, f"past_v_{layer}": past_v}
            feed |= {f"cross_k_{layer}": cross_k, f"cross_v_{layer}": cross_v}
        outputs = dict(zip(self._decoder_outputs, self.decoder.run(self._decoder_outputs, feed), strict=True))
        present = [(outputs[f"present_k_{i}"], outputs[f"present_v_{i}"]) for i in range(len(inputs.past))]
        return DecoderStepOutputs(
            outputs["next_token"], outputs["next_logprob"], outputs["no_speech_prob"], present,
            outputs["top_tokens"], outputs["top_logprobs"],
        )

    def decoder_input(self, name: str) -> ort.NodeArg:
        return next(i for i in self.decoder.get_inputs() if i.name == name)

    @property
    def _decoder_outputs(self) -> list[str]:
        return [o.name for o in self.decoder.get_outputs()]

    def empty_cache(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = self.decoder_input("past_k_0").shape  # [batch, heads, past, head_dim]
        empty = np.zeros((batch, int(shape[1]), 0, int(shape[3])), np.float32)
        return [(empty, empty) for _ in range(self.decoder_layers)]


@dataclass
class DecoderStepInputs:
    tokens: np.ndarray  # [B, N] int64
    positions: np.ndarray  # [B, N] int64: each token's position in its own row's sequence
    past: list[tuple[np.ndarray, np.ndarray]]  # per layer [B, H, P, Dh]
    cross: list[tuple[np.ndarray, np.ndarray]]  # per layer [B, H, S, Dh]
    cross_mask: np.ndarray  # [B, S] float32, 1 = audio
    self_mask: np.ndarray  # [B, P+N] float32, 1 = a token (past and new), 0 = prompt padding
    logit_bias: np.ndarray  # [V] float32, 0 or -inf
    no_speech_id: int
    top_k: int = 1  # best tokens per row in top_tokens/top_logprobs (beam search asks for more)


@dataclass
class DecoderStepOutputs:
    next_token: np.ndarray  # [B] int64
    next_logprob: np.ndarray  # [B] float32
    no_speech_prob: np.ndarray  # [B] float32
    present: list[tuple[np.ndarray, np.ndarray]]
    top_tokens: np.ndarray  # [B, top_k] int64, best first
    top_logprobs: np.ndarray  # [B, top_k] float32, under the biased distribution
