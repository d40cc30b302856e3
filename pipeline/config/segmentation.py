"""Settings of voice-activity detection and segmentation."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SegmentationSettings(BaseModel):
    endpoint_silence_ms: int = Field(500, description="Trailing silence that closes a speech segment (ms).")
