"""Moonshine tiny-en and base-en behind the recogniser contract: built from the packages' .ort graphs into a
signed-able, sha256-checked folder, real speech transcribed, batches equal to one-by-one decoding, the
canary, hot reload, a corrupted folder refused, nothing said on non-speech. Both models are built once
for this module (a few seconds each)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile as sf
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnx import numpy_helper
from typer.testing import CliRunner

from pipeline.asr.build import BuildResult, build_model
from pipeline.asr.canary import CANARY_TRANSCRIPT, ModelCanaryError, load_checked, run_canary
from pipeline.asr.cli import models_app, transcribe
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import ModelIntegrityError, sha256_of
from pipeline.asr.moonshine_graphs import all_nodes, find_source, source_sha256
from pipeline.asr.moonshine_recognizer import MoonshineRecognizer
from pipeline.asr.moonshine_tokenizer import MoonshineTokenizer
from pipeline.asr.recognizer import Recognizer, SegmentRejectedError
from pipeline.asr.recognizers import load_recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.asr.signing import ModelSignatureError, public_key_text, sign_model
from pipeline.config import Settings, get_settings
from pipeline.eval.conditions import conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.eval.non_speech import emitted_words, non_speech_set
from pipeline.eval.wer import word_error_rate, word_errors

MODELS = ("moonshine-tiny", "moonshine-base")


@pytest.fixture(scope="module")
def moonshine_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moonshine-models")


@pytest.fixture(scope="module")
def builds(moonshine_dir: Path) -> dict[str, BuildResult]:
    return {name: build_model(name, moonshine_dir) for name in MODELS}


@pytest.fixture(scope="module")
def settings(moonshine_dir: Path, builds: dict[str, BuildResult]) -> Settings:
    return Settings(models_dir=str(moonshine_dir), intra_op_threads=2)


@pytest.fixture(scope="module")
def recognizers(builds: dict[str, BuildResult], settings: Settings) -> dict[str, Recognizer]:
    return {name: load_recognizer(b.folder, settings) for name, b in builds.items()}


@pytest.fixture(scope="module")
def base_fp32(builds: dict[str, BuildResult], settings: Settings) -> Recognizer:
    """Moonshine base on its fp32 graphs (the default is int8row-decoder)."""
    return load_recognizer(builds["moonshine-base"].folder, settings.model_copy(update={"quantization": "fp32"}))


@pytest.fixture(scope="module")
def eval_8k_mulaw() -> list[EvalUtterance]:
    return conditioned(load_eval_set(), "8k-mulaw")


@pytest.fixture(scope="module")
def batched(recognizers: dict[str, Recognizer], eval_8k_mulaw: list[EvalUtterance]
            ) -> dict[str, list[TranscriptResult | Exception]]:
    """Each model's results for the 20 utterances decoded as one batch."""
    return {name: r.recognize(_segments(eval_8k_mulaw)) for name, r in recognizers.items()}


def _segments(utterances: list[EvalUtterance]) -> list[AudioSegment]:
    return [AudioSegment(0, u.audio.size // 16, u.audio) for u in utterances]


def _texts(slots: list[TranscriptResult | Exception]) -> list[str]:
    assert all(isinstance(s, TranscriptResult) for s in slots), slots
    return [s.text for s in slots]  # type: ignore[union-attr]


def test_build_writes_checked_files_from_the_packages(builds: dict[str, BuildResult]) -> None:
    for name, build in builds.items():
        m = build.manifest
        source = find_source(name)
        assert m.family == "moonshine" and m.format_current and m.name == name and m.version == 1
        assert (m.source_package, m.source_version) == (source.package, source.version)
        assert m.source_sha256 == source_sha256(source)
        assert m.vocabulary_file == "tokenizer.bin" and m.sample_rate == 16000
        assert {"encoder", "decoder"} == set(m.graphs["fp32"])
        assert set(m.files) == {p.name for p in build.folder.iterdir() if p.name != "manifest.json"}
        assert all(sha256_of(build.folder / f) == digest for f, digest in m.files.items())
        # fp32 graphs: no per-run int8 -> float cast of a weight (base-en), no dynamic-int8 MatMul
        # (tiny-en); tiny-en's token embedding stays uint8, looked up row by row (Gather, DequantizeLinear).
        for part in ("encoder", "decoder"):
            graph = onnx.load(str(build.folder / m.graphs["fp32"][part])).graph
            int8 = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)}
            ops = [(n.op_type, list(n.input)) for n in all_nodes(graph)]
            assert not [o for o, ins in ops if o in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat")], name
            assert not [o for o, ins in ops if o == "Cast" and ins[0] in int8], (name, part)
            assert {o for o, ins in ops if set(ins) & int8} <= {"Gather", "DequantizeLinear"}, (name, part)
        decoder = onnx.load(str(build.folder / m.graphs["fp32"]["decoder"])).graph
        assert {i.name for i in decoder.input} >= {"encoder_attention_mask", "input_ids", "use_cache_branch"}
    # tiny-en also keeps its shipped dynamic-int8 kernels as the int8 variant; both have 8-bit weights in
    # blocks (int8row), and int8row-decoder pairs the fp32 encoder with the int8row decoder (the default).
    assert set(builds["moonshine-tiny"].manifest.graphs) == {"fp32", "int8", "int8row", "int8row-decoder"}
    base = builds["moonshine-base"]
    assert base.manifest.graphs["int8row-decoder"] == {"encoder": base.manifest.graphs["fp32"]["encoder"],
                                                       "decoder": base.manifest.graphs["int8row"]["decoder"]}
    decoder = onnx.load(str(base.folder / base.manifest.graphs["int8row"]["decoder"])).graph
    weights = {t.name for t in decoder.initializer if len(t.dims) == 2}
    ops = [(n.op_type, list(n.input)) for n in all_nodes(decoder)]
    # every weight MatMul (the layers inside the If's branches, the tied logits) is 8-bit; what stays a MatMul
    # multiplies activations (attention scores and values)
    assert sum(1 for o, _ in ops if o == "MatMulNBits") == 146
    assert not [ins for o, ins in ops if o == "MatMul" and (set(ins) & weights or ins[1].endswith("transposed"))]


def test_tokenizer_reads_the_shipped_vocabulary() -> None:
    tiny = MoonshineTokenizer.load(find_source("moonshine-tiny").file("tokenizer.bin"))
    base = MoonshineTokenizer.load(find_source("moonshine-base").file("tokenizer.bin"))
    assert (len(tiny), len(base)) == (32768, 32000)
    assert tiny.pieces[:3] == (b"<unk>", b"<s>", b"</s>") and tiny.pieces[3] == b"\x00"
    said = [i for i, p in enumerate(base.pieces) if p in ("\u2581ten".encode(), "\u2581of".encode())]
    assert base.decode(said) in ("ten of", "of ten")
    never = set(base.never_said(32768).tolist())
    assert {0, 1, 32000, 32767} <= never and 2 not in never and 300 not in never


def test_real_speech_is_transcribed_within_a_wer_bound(
    recognizers: dict[str, Recognizer], eval_8k_mulaw: list[EvalUtterance],
    batched: dict[str, list[TranscriptResult | Exception]],
) -> None:
    """The 20 evaluation utterances (LibriVox, cards, digits, ALSA voices) as a phone line carries them."""
    for name, recognizer in recognizers.items():
        assert isinstance(recognizer, MoonshineRecognizer)
        slots = batched[name]
        texts = _texts(slots)
        wer = word_error_rate([u.reference for u in eval_8k_mulaw], texts)
        print(f"{name}: WER {wer:.1%}")
        assert wer <= 0.10, (name, wer, texts)
        assert all(t.strip() for t in texts), texts  # every utterance said something
        for slot in slots:
            assert isinstance(slot, TranscriptResult)
            assert slot.model == name and slot.model_version == 1
            assert 0.0 < slot.confidence <= 1.0 and not slot.is_silence


def test_the_default_8_bit_decoder_keeps_the_fp32_text(
    recognizers: dict[str, Recognizer], settings: Settings, base_fp32: Recognizer,
    eval_8k_mulaw: list[EvalUtterance], batched: dict[str, list[TranscriptResult | Exception]],
) -> None:
    """Moonshine's default graphs (quantization auto: int8row-decoder) against fp32 on the evaluation set,
    8 kHz mu-law: the same word errors within one (the set has 117 words)."""
    assert settings.graphs_for("moonshine") == "int8row-decoder"
    fp32 = base_fp32
    references = [u.reference for u in eval_8k_mulaw]
    exact = sum(word_errors(r, t).errors for r, t in zip(references, _texts(fp32.recognize(_segments(eval_8k_mulaw))), strict=True))
    ours = sum(word_errors(r, t).errors for r, t in zip(references, _texts(batched["moonshine-base"]), strict=True))
    assert recognizers["moonshine-base"].model.label.endswith("/int8row-decoder")
    assert ours <= exact + 1, (ours, exact)


def test_batched_text_equals_one_by_one(
    recognizers: dict[str, Recognizer], eval_8k_mulaw: list[EvalUtterance], base_fp32: Recognizer,
    batched: dict[str, list[TranscriptResult | Exception]],
) -> None:
    """Segments of 1-7 s share the decoder batch, padded and masked: each row's tokens are its own
    (checked one by one on the longest, the shortest and some between). fp32 graphs give the same tokens;
    the default int8row-decoder rounds activations to 8 bits, which can turn the last-bit difference of fp32
    attention over a padded batch into another last token: a trailing full stop at most ("Rear left" alone,
    "Rear left." in the batch of 20, eval row 16)."""
    rows = (0, 2, 5, 6, 9, 11, 16)  # 7.1, 5.3, 1.1, 2.0, 3.5, 2.4, 1.3 s
    fp32 = base_fp32
    exact = fp32.recognize(_segments([eval_8k_mulaw[row] for row in rows]))
    for row, b in zip(rows, exact, strict=True):
        a = fp32.recognize(_segments([eval_8k_mulaw[row]]))[0]
        assert isinstance(b, TranscriptResult) and isinstance(a, TranscriptResult)
        assert (b.tokens, b.text) == (a.tokens, a.text), ("fp32", row)
        assert b.avg_logprob == pytest.approx(a.avg_logprob, abs=1e-4)
    for name, recognizer in recognizers.items():
        assert {r.timings.batch_size for r in batched[name] if isinstance(r, TranscriptResult)} == {20}
        for row in rows:
            b, a = batched[name][row], recognizer.recognize(_segments([eval_8k_mulaw[row]]))[0]
            assert isinstance(b, TranscriptResult) and isinstance(a, TranscriptResult)
            assert a.timings.batch_size == 1
            if b.tokens != a.tokens:
                assert b.text.rstrip(".,?!") == a.text.rstrip(".,?!"), (name, row, a.text, b.text)


def test_segments_over_ten_seconds_decode(recognizers: dict[str, Recognizer]) -> None:
    """tiny-en's shipped decoder fails past 415 encoder frames (10 s); the build replaced its mask term."""
    librivox = [u for u in load_eval_set() if u.id.startswith("librivox/")]
    audio = np.concatenate([u.audio for u in librivox[:3]])  # 15.4 s
    reference = " ".join(u.reference for u in librivox[:3])
    for name, recognizer in recognizers.items():
        slot = recognizer.recognize([AudioSegment(0, audio.size // 16, audio)])[0]
        assert isinstance(slot, TranscriptResult), (name, slot)
        assert word_errors(reference, slot.text).wer <= 0.15, (name, slot.text)


def test_a_bad_segment_fails_alone_and_a_short_one_is_padded(recognizers: dict[str, Recognizer]) -> None:
    recognizer = recognizers["moonshine-tiny"]
    audio = next(u.audio for u in load_eval_set() if u.id == "cards/001")  # "ten of clubs"
    nan = np.full(8000, np.nan, np.float32)
    short = audio[:800]  # 50 ms: below the encoder's 0.1 s, zero-padded
    slots = recognizer.recognize([AudioSegment(0, 500, nan), AudioSegment(0, 50, short),
                                  AudioSegment(0, audio.size // 16, audio)])
    assert isinstance(slots[0], SegmentRejectedError)
    assert isinstance(slots[1], TranscriptResult)
    assert isinstance(slots[2], TranscriptResult) and word_errors("ten of clubs", slots[2].text).wer <= 0.34


def test_canary_passes_and_a_broken_or_corrupted_folder_is_refused(
    builds: dict[str, BuildResult], settings: Settings, tmp_path: Path
) -> None:
    for name, build in builds.items():
        recognizer = load_checked(build.folder, settings)
        assert isinstance(recognizer, MoonshineRecognizer)
        assert run_canary(recognizer, 0.0).wer == 0.0, name
    int8 = load_recognizer(builds["moonshine-tiny"].folder, settings.model_copy(update={"quantization": "int8"}))
    assert int8.model.label == "moonshine-tiny@1/int8" and run_canary(int8, 0.0).wer == 0.0
    tiny = builds["moonshine-tiny"]
    fp32 = settings.model_copy(update={"quantization": "fp32"})  # the graphs changed below
    # One byte changed in a graph: refused by its sha256, at load.
    corrupted = _copy_version(tiny, tmp_path, 2)
    graph = corrupted / "decoder.fp32.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.unlink()
    graph.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=r"decoder\.fp32\.onnx: sha256 .* does not match"):
        load_recognizer(corrupted, fp32)
    # Intact files of a wrong model (a layer's weights zeroed, manifest rewritten to match): the canary.
    broken = _copy_version(tiny, tmp_path, 3)
    model = onnx.load(str(broken / "decoder.fp32.onnx"))
    largest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    largest.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(largest)), largest.name))
    (broken / "decoder.fp32.onnx").unlink()
    onnx.save(model, str(broken / "decoder.fp32.onnx"))
    files = dict(tiny.manifest.files) | {"decoder.fp32.onnx": sha256_of(broken / "decoder.fp32.onnx")}
    (broken / "manifest.json").unlink()
    replace(tiny.manifest, version=3, files=files).write(broken)
    with pytest.raises(ModelCanaryError, match=rf"^{broken}: refused: canary WER"):
        load_checked(broken, fp32)


def test_a_signed_build_loads_under_a_trusted_key_and_an_unsigned_one_is_refused(
    builds: dict[str, BuildResult], settings: Settings, tmp_path: Path
) -> None:
    key = Ed25519PrivateKey.generate()
    trusting = settings.model_copy(update={"model_public_key": public_key_text(key.public_key())})
    unsigned = _copy_version(builds["moonshine-tiny"], tmp_path, 1)
    with pytest.raises(ModelSignatureError, match="missing signature"):
        load_checked(unsigned, trusting)
    signed = _copy_version(builds["moonshine-tiny"], tmp_path, 2)
    sign_model(signed, key)
    assert load_checked(signed, trusting).version == 2


def _copy_version(build: BuildResult, models_dir: Path, version: int) -> Path:
    """The build as models_dir/<name>/<version>/: graphs hard-linked (replace a file to change it),
    manifest saying that version."""
    folder = models_dir / build.manifest.name / str(version)
    shutil.copytree(build.folder, folder, copy_function=os.link)
    (folder / "manifest.json").unlink()
    replace(build.manifest, version=version).write(folder)
    return folder


async def test_engine_loads_by_name_and_the_batcher_hot_reloads(
    builds: dict[str, BuildResult], settings: Settings, eval_8k_mulaw: list[EvalUtterance], tmp_path: Path
) -> None:
    models = tmp_path / "models"
    first = _copy_version(builds["moonshine-tiny"], models, 1)
    own = settings.model_copy(update={"models_dir": str(models), "model": "moonshine-tiny"})
    engine = Engine.load(settings=own, build=False)  # CALLQA_MODEL=moonshine-tiny
    assert engine.model_label == "moonshine-tiny@1/int8row-decoder" and engine.recognizer.model.folder == first
    segments = _segments(eval_8k_mulaw[:4])
    expected = [r.text for r in engine.transcribe_segments(segments)]
    batcher = engine.new_batcher()
    await batcher.start()
    try:
        before = await asyncio.gather(*(batcher.submit(s) for s in segments))
        corrupted = _copy_version(builds["moonshine-tiny"], models, 2)
        (corrupted / "tokenizer.bin").unlink()
        with pytest.raises(ModelIntegrityError, match="tokenizer.bin: missing"):
            await batcher.reload(corrupted, own)
        assert batcher.recognizer.version == 1  # the refused version never served
        taken = await batcher.reload(_copy_version(builds["moonshine-tiny"], models, 3), own)
        after = await asyncio.gather(*(batcher.submit(s) for s in segments))
    finally:
        await batcher.close()
    assert [(r.text, r.model_version) for r in before] == [(t, 1) for t in expected]
    assert taken.version == 3 and [(r.text, r.model_version) for r in after] == [(t, 3) for t in expected]
    assert word_errors(CANARY_TRANSCRIPT, run_canary(taken, 0.2).text).wer == 0.0


def test_cli_builds_if_needed_and_transcribes_with_the_model_option(
    moonshine_dir: Path, builds: dict[str, BuildResult], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CALLQA_MODELS_DIR", str(moonshine_dir))
    get_settings.cache_clear()
    try:
        app = typer.Typer()
        app.add_typer(models_app, name="models")
        app.command("transcribe")(transcribe)
        built = CliRunner().invoke(app, ["models", "build", "moonshine-tiny", "--if-needed"])
        assert built.exit_code == 0 and "moonshine-tiny: version 1 is built" in built.stdout, built.stdout
        listed = CliRunner().invoke(app, ["models", "list", "--json"])
        rows = {r["model"]: r for r in json.loads(listed.stdout)}
        assert rows["moonshine-base"]["source_package"] == "moonshine-cpp" and rows["moonshine-tiny"]["graphs"] == ["fp32", "int8", "int8row", "int8row-decoder"]
        cards = next(u for u in load_eval_set() if u.id == "cards/005")
        path = tmp_path / "cards.wav"
        sf.write(path, np.concatenate([np.zeros(8000, np.float32), cards.audio, np.zeros(8000, np.float32)]), 16000)
        done = CliRunner().invoke(app, ["transcribe", "--json", "--model", "moonshine-base", str(path)])
        assert done.exit_code == 0, done.stdout + done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert [line["model"] for line in lines] == ["moonshine-base"]
        assert word_errors(cards.reference, lines[0]["text"]).wer <= 0.2
    finally:
        get_settings.cache_clear()


def test_no_words_on_non_speech_and_caps_per_second_of_audio(recognizers: dict[str, Recognizer],
                                                              builds: dict[str, BuildResult],
                                                              settings: Settings) -> None:
    """Through the worker's path (μ-law leg, VAD segmenter, recogniser) the non-speech set gives no words.
    Fed to the recogniser straight (no VAD), Moonshine does say things on music and noise ("Thank you for
    watching!"), as Whisper does; the per-second token cap bounds each."""
    sounds = non_speech_set(music_s=12.0)
    engine = Engine(recognizers["moonshine-tiny"], settings)
    emitted = {r.id: r.texts for r in emitted_words(engine, sounds) if r.words}
    assert not emitted, emitted
    recognizer = recognizers["moonshine-tiny"]
    chunks = [u.audio[: 16000 * 4] for u in sounds if u.audio.size >= 16000]
    for chunk, slot in zip(chunks, recognizer.recognize(_segments_of(chunks)), strict=True):
        assert isinstance(slot, TranscriptResult)
        assert len(slot.tokens) <= recognizer.decoder.options.token_cap(chunk.size / 16000)


def _segments_of(audios: list[np.ndarray]) -> list[AudioSegment]:
    return [AudioSegment(0, a.size // 16, a) for a in audios]
