"""Settings of the Faust worker."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    worker_id: str = Field("callqa-worker", description="Faust app id (consumer group) of the worker.")
    web_port: int = Field(6066, description="Port of the worker's web server (/metrics, /api).")
