"""Settings of the ASR engine: model, front end, segmentation, batcher, decoding."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class AsrSettings(BaseModel):
    model: str = Field("tiny.en", description="Whisper model to build and load (tiny.en or base).")
    models_dir: str = Field("models", description="Where built ONNX models live (models/<name>/<version>/).")
    quantization: Literal["fp32", "int8"] = Field(
        "int8", description="ONNX graph variant to run: dynamic int8 (faster) or fp32 (matches faster-whisper fp32)."
    )
    window_bucket_s: float = Field(
        10.0, description="Encoder window: segment length rounded up to this many seconds (0 = Whisper's 30 s)."
    )
    max_tokens_per_second: float = Field(
        5.0, description="Cap on decoded tokens per second of audio (plus a small allowance): stops run-on loops."
    )
    full_window_retry: bool = Field(
        True, description="Decode again in the full 30 s window a segment that hit the token cap or looped."
    )
    max_batch: int = Field(16, description="Most segments decoded together in one batch.")
    max_wait_ms: float = Field(30.0, description="Longest a segment waits in the batcher for others to join it (ms).")
    batcher_queue_size: int = Field(256, description="Segments queued in the batcher before submit() waits.")
    intra_op_threads: int = Field(0, description="ONNX Runtime intra-op threads per session (0 = all cores).")
