"""A built Whisper model loaded into ONNX Runtime: verified files, encoder and decoder-step sessions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.asr.manifest import Manifest, ModelIntegrityError, latest_model_folder
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

    @property
    def label(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}/{self.quantization}"

    @classmethod
    def load(cls, folder: Path, quantization: str = "int8", intra_op_threads: int = 0) -> WhisperOnnx:
        """Load a model folder after checking every file it needs against the manifest's sha256."""
        manifest = Manifest.read(folder)
        graphs = manifest.graphs.get(quantization)
        if graphs is None:
            raise ModelIntegrityError(
                f"{folder}: no {quantization!r} graphs (have {sorted(manifest.graphs)})"
            )
        manifest.verify(folder, [graphs["encoder"], graphs["decoder"], manifest.vocabulary_file])
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        return cls(
            manifest=manifest,
            folder=folder,
            quantization=quantization,
            vocabulary=Vocabulary.load(folder / manifest.vocabulary_file),
            encoder=ort.InferenceSession(str(folder / graphs["encoder"]), options, providers=providers),
            decoder=ort.InferenceSession(str(folder / graphs["decoder"]), options, providers=providers),
        )

    @classmethod
    def load_latest(
        cls, models_dir: Path, name: str, quantization: str, intra_op_threads: int = 0
    ) -> WhisperOnnx:
        return cls.load(latest_model_folder(models_dir, name), quantization, intra_op_threads)

    def encode(self, mel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """mel [B, n_mels, T] -> cross keys and values [L, B, H, T/2, Dh]."""
        cross_k, cross_v = self.encoder.run(None, {"mel": np.ascontiguousarray(mel, dtype=np.float32)})
        return cross_k, cross_v

    def decode_step(
        self,
        tokens: np.ndarray,
        past: tuple[np.ndarray, np.ndarray],
        cross: tuple[np.ndarray, np.ndarray],
        cross_mask: np.ndarray,
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One decoder step for the whole batch: logits [B, N, vocab] and the grown self-attention cache."""
        logits, present_k, present_v = self.decoder.run(
            None,
            {
                "tokens": tokens.astype(np.int64),
                "past_k": past[0],
                "past_v": past[1],
                "cross_k": cross[0],
                "cross_v": cross[1],
                "cross_mask": cross_mask,
            },
        )
        return logits, (present_k, present_v)

    def empty_cache(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        shape = self.decoder.get_inputs()[1].shape
        empty = np.zeros((int(shape[0]), batch, int(shape[2]), 0, int(shape[4])), np.float32)
        return empty, empty
