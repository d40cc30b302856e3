"""Settings of call QA analytics."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QaSettings(BaseModel):
    rules_dir: str = Field("rules", description="Folder of QA rule YAML files.")
    qa_scorecard_file: str = Field(
        "rules/scorecards/default.yaml",
        description="Scorecard (weighted questions) every call is scored with.",
    )
    qa_silence_threshold_ms: int = Field(
        5000, ge=0, description="A gap between speech longer than this counts as a silence (ms)."
    )
    qa_interruption_min_overlap_ms: int = Field(
        500,
        ge=0,
        description="Overlap a leg must talk over the other for it to count as an interruption (ms).",
    )
    qa_fuzzy_threshold: float = Field(
        0.8,
        ge=0.5,
        le=1.0,
        description="Minimum similarity (1 - edit distance / length) of a fuzzy phrase match.",
    )
    qa_redaction_enabled: bool = Field(
        True, description="Redact PII before transcripts leave the worker; false stores unredacted text."
    )
    qa_redact_names: bool = Field(
        False,
        description="Also redact personal names ([NAME]): the words after \"my name is\" and the short answer "
        "to a question for a name. Off by default: names are what a supervisor looks calls up by, and the "
        "rules miss names said elsewhere.",
    )
    qa_exchange_idle_ms: int = Field(
        30_000,
        ge=0,
        description="Speech (either leg, ms) on something else that ends a sensitive exchange (payment, "
        "identity, bank details, address, PIN or password, contact details; pipeline/qa/exchange.py). "
        "Backchannels, digressions and holds do not count: a caller fetching the card keeps it open.",
    )
