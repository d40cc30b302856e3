"""Settings of the ASR engine: model, front end, segmentation, batcher, decoding."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AsrSettings(BaseModel):
    model: str = Field("tiny.en", description="Whisper model to build and load (tiny.en or base).")
    models_dir: str = Field("models", description="Where built ONNX models live (models/<name>/<version>/).")
