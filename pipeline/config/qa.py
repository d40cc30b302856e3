"""Settings of call QA analytics."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QaSettings(BaseModel):
    rules_dir: str = Field("rules", description="Folder of QA rule YAML files.")
