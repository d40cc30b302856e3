"""Canary inference and guarded hot swaps: a model must be signed and transcribe the shipped canary
utterance before it takes traffic; a refused one never replaces the model that is serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.canary import (
    CANARY_AUDIO,
    CANARY_TRANSCRIPT,
    ModelCanaryError,
    canary_audio_16k,
    load_checked,
    run_canary,
)
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import ModelIntegrityError
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment
from pipeline.asr.signing import ModelSignatureError, public_key_text, sign_model
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.wer import word_errors
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.transcriber import BatcherTranscriber


@pytest.fixture
def trusting(asr_settings: Settings, signing_key: Ed25519PrivateKey, tmp_path: Path) -> Settings:
    """fp32 (the default graphs), models in tmp_path, signatures by the session's key required."""
    return asr_settings.model_copy(update={
        "models_dir": str(tmp_path), "quantization": "fp32",
        "model_public_key": public_key_text(signing_key.public_key()),
    })


def _utterance_segment(utterance: EvalUtterance) -> AudioSegment:
    return AudioSegment(0, int(utterance.duration_s * 1000), utterance.audio)


def test_canary_ships_inside_the_package_and_the_built_model_passes_it(
    recognizer_fp32: Recognizer, asr_settings: Settings
) -> None:
    import pipeline

    assert CANARY_AUDIO.is_relative_to(Path(pipeline.__file__).parent)  # no Debian test data needed
    assert 20_000 < CANARY_AUDIO.stat().st_size < 100_000
    int8 = Recognizer.load(recognizer_fp32.model.folder, asr_settings.model_copy(update={"quantization": "int8"}))
    for model in (recognizer_fp32, int8):
        result = run_canary(model, max_wer=0.0)
        assert result.wer == 0.0, (model.model.label, result.text)


@pytest.mark.slow
def test_correctly_signed_but_broken_model_is_refused_by_the_canary_at_start(
    trusting: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path],
    broken_decoder: Path,
) -> None:
    broken = place_version(Path(trusting.models_dir), 1, key=signing_key, decoder=broken_decoder)
    with pytest.raises(ModelCanaryError, match=rf"^{broken}: refused: canary WER \d+% > 20% \(heard "):
        Engine.load("tiny.en", settings=trusting)
    # The canary is what refused it (signature and sha256s hold): switched off, the same folder goes live
    # and mistranscribes.
    unguarded = Engine.load("tiny.en", settings=trusting.model_copy(update={"model_canary": False}))
    audio = canary_audio_16k()
    heard = unguarded.transcribe_segments([AudioSegment(0, audio.size // 16, audio)], keep_silence=True)
    assert word_errors(CANARY_TRANSCRIPT, " ".join(r.text for r in heard)).wer > 0.2


@pytest.mark.slow
async def test_batcher_reload_refuses_bad_signature_and_failed_canary_while_the_old_model_serves(
    recognizer_fp32: Recognizer, trusting: Settings, signing_key: Ed25519PrivateKey,
    place_version: Callable[..., Path], broken_decoder: Path, eval_sets: dict[str, list[EvalUtterance]],
) -> None:
    models = Path(trusting.models_dir)
    segments = [_utterance_segment(eval_sets["8k-mulaw"][i]) for i in (1, 4, 11)]  # 2.4-3.3 s, no 30 s retry
    expected = [r.text for r in recognizer_fp32.recognize(segments) if not isinstance(r, Exception)]
    bad_signature = place_version(models, 2, key=signing_key)
    signed_text = (bad_signature / "manifest.json").read_text()
    # Same meaning, other bytes: the signature covers the exact bytes, not a parse of them.
    (bad_signature / "manifest.json").write_text(signed_text.replace('"version": 2,', '"version": 2 ,'))
    assert (bad_signature / "manifest.json").read_text() != signed_text
    broken = place_version(models, 3, key=signing_key, decoder=broken_decoder)
    good = place_version(models, 4, key=signing_key)
    batcher = SegmentBatcher(recognizer_fp32, max_batch=4, max_wait_ms=50)
    await batcher.start()
    try:
        for folder, error in ((bad_signature, ModelSignatureError), (broken, ModelCanaryError)):
            # Calls keep being transcribed while the new version is loaded and checked beside them.
            outcomes = await asyncio.gather(
                batcher.reload(folder, trusting), *(batcher.submit(s) for s in segments), return_exceptions=True
            )
            assert isinstance(outcomes[0], error), outcomes[0]
            assert [(r.text, r.model_version) for r in outcomes[1:]] == [(t, 1) for t in expected]  # type: ignore[union-attr]
            assert batcher.recognizer is recognizer_fp32
        taken = await batcher.reload(good, trusting)
        after = await asyncio.gather(*(batcher.submit(s) for s in segments))
    finally:
        await batcher.close()
    assert batcher.recognizer is taken and taken.version == 4
    assert [(r.text, r.model_version) for r in after] == [(t, 4) for t in expected]


@pytest.mark.slow
async def test_worker_refuses_each_bad_version_once_counts_it_and_takes_it_once_signed(
    recognizer_fp32: Recognizer, trusting: Settings, signing_key: Ed25519PrivateKey,
    place_version: Callable[..., Path], broken_decoder: Path, eval_sets: dict[str, list[EvalUtterance]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's watcher (BatcherTranscriber.reload_if_newer, in-process, no Kafka)."""
    models = Path(trusting.models_dir)
    place_version(models, 1, key=signing_key)
    metrics = WorkerMetrics()
    transcriber = BatcherTranscriber(Engine(recognizer_fp32, trusting), metrics)
    await transcriber.start()
    audio = eval_sets["8k-mulaw"][4].audio

    def refused(reason: str) -> float:
        value = metrics.registry.get_sample_value("callqa_model_reloads_refused_total", {"reason": reason})
        return -1.0 if value is None else value

    caplog.set_level(logging.WARNING, logger="callqa.worker")
    try:
        assert (refused("signature"), refused("canary")) == (0.0, 0.0)  # exported before any refusal
        place_version(models, 2, key=signing_key, decoder=broken_decoder)
        assert not await transcriber.reload_if_newer()
        assert not await transcriber.reload_if_newer()  # looked at again: refused, but not said again
        assert refused("canary") == 1.0
        unsigned = place_version(models, 3)  # built; `callqa models sign` not run yet
        assert not await transcriber.reload_if_newer()
        assert not await transcriber.reload_if_newer()
        assert refused("signature") == 1.0
        assert (await transcriber.transcribe(audio)).model_version == 1
        assert metrics.registry.get_sample_value("callqa_model_version") == 1
        sign_model(unsigned, signing_key)
        assert await transcriber.reload_if_newer()
        assert (await transcriber.transcribe(audio)).model_version == 3
    finally:
        await transcriber.close()
    assert metrics.registry.get_sample_value("callqa_model_version") == 3
    refusals = [r.getMessage() for r in caplog.records if "model reload refused" in r.getMessage()]
    assert len(refusals) == 2
    assert "2: refused: canary WER" in refusals[0] and "3: refused: missing signature" in refusals[1]


def test_a_signed_folder_onnx_runtime_cannot_load_is_refused_in_one_line(
    trusting: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path], tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08" * 1000)
    folder = place_version(Path(trusting.models_dir), 1, key=signing_key, decoder=garbage)
    with pytest.raises(ModelIntegrityError, match=rf"^{folder}: refused: cannot load it \(\w+: [^\n]*\)$"):
        load_checked(folder, trusting)
