"""Build a model version folder: ONNX Whisper graphs (fp32 and dynamic int8) from the CTranslate2 weights of an
installed package, or Moonshine's graphs from the `.ort` files its packages ship (``moonshine_graphs``)."""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.asr.ct2 import find_source, load_source, load_suppress_config
from pipeline.asr.graph import build_decoder, build_encoder
from pipeline.asr.manifest import (
    GRAPH_FORMAT,
    GRAPH_REVISION,
    MOONSHINE_GRAPH_FORMAT,
    MOONSHINE_GRAPH_REVISION,
    Manifest,
    model_versions,
    sha256_of,
)
from pipeline.asr.matmul_nbits import quantize_model
from pipeline.asr.moonshine_graphs import is_moonshine
from pipeline.asr.signing import sign_model

SAMPLE_RATE = 16000
VOCABULARY_FILE = "vocabulary.txt"
# int8row: 8-bit weights as MatMulNBits, activations quantized per row (matmul_nbits): text independent
# of the batch, unlike int8's batch-wide activation scale. int8row-decoder: fp32 encoder, int8row decoder.
QUANTIZATIONS = ("fp32", "int8", "int8row")


@dataclass(frozen=True)
class BuildResult:
    folder: Path
    manifest: Manifest


def _quantize(src: Path, dst: Path) -> None:
    # Imported here: the quantization tooling is only needed at build time.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])


def _tool_versions() -> dict[str, str]:
    return {pkg: importlib.metadata.version(pkg) for pkg in ("onnx", "onnxruntime", "numpy")}


def _write_graphs(folder: Path, name: str) -> tuple[dict[str, dict[str, str]], object]:
    source = find_source(name)
    weights = load_source(source)
    graphs: dict[str, dict[str, str]] = {q: {} for q in QUANTIZATIONS}
    for part, graph in (("encoder", build_encoder(weights)), ("decoder", build_decoder(weights))):
        fp32 = folder / f"{part}.fp32.onnx"
        onnx.save(graph, fp32)
        del graph
        _quantize(fp32, folder / f"{part}.int8.onnx")
        quantize_model(fp32, folder / f"{part}.int8row.onnx")
        graphs["fp32"][part] = fp32.name
        graphs["int8"][part] = f"{part}.int8.onnx"
        graphs["int8row"][part] = f"{part}.int8row.onnx"
    graphs["int8row-decoder"] = {"encoder": graphs["fp32"]["encoder"], "decoder": graphs["int8row"]["decoder"]}
    return graphs, weights.sha256


def build_model(
    name: str, models_dir: Path, version: int | None = None, sign_key: Ed25519PrivateKey | None = None
) -> BuildResult:
    """Write models_dir/<name>/<version>/ (next free version by default) and return its manifest;
    signed with `sign_key` before it appears, so a watching worker never sees it unsigned."""
    existing = model_versions(models_dir, name)
    version = version if version is not None else (existing[-1] + 1 if existing else 1)
    final = models_dir / name / str(version)
    if final.exists():
        raise FileExistsError(f"{final} already exists: choose another version")
    write = _moonshine_folder if is_moonshine(name) else _whisper_folder
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build in a temporary sibling and rename, so a crash never leaves a half-built version behind.
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        manifest = write(name, version, work)
        manifest.write(work)
        if sign_key is not None:
            sign_model(work, sign_key)
        work.chmod(0o755)  # mkdtemp makes it private; a model folder is shared read-only data
        work.rename(final)
    return BuildResult(final, manifest)


def _whisper_folder(name: str, version: int, work: Path) -> Manifest:
    """Whisper's graphs and vocabulary written into ``work``; their manifest."""
    source = find_source(name)
    graphs, source_sha = _write_graphs(work, name)
    shutil.copyfile(source.folder / VOCABULARY_FILE, work / VOCABULARY_FILE)
    suppress = load_suppress_config(source)
    return Manifest(
        name=name,
        version=version,
        source_package=source.package,
        source_version=source.version,
        source_sha256=str(source_sha),
        files=_file_hashes(work),
        graphs=graphs,
        vocabulary_file=VOCABULARY_FILE,
        sample_rate=SAMPLE_RATE,
        n_mels=80,
        suppress_ids=suppress["suppress_ids"],
        suppress_ids_begin=suppress["suppress_ids_begin"],
        tools=_tool_versions(),
        graph_format=GRAPH_FORMAT,
        graph_revision=GRAPH_REVISION,
    )


def _moonshine_folder(name: str, version: int, work: Path) -> Manifest:
    """A Moonshine version's converted graphs and tokenizer.bin written into ``work``; their manifest."""
    from pipeline.asr.moonshine_graphs import TOKENIZER_FILE, source_sha256, write_graphs
    from pipeline.asr.moonshine_graphs import find_source as find_moonshine

    source = find_moonshine(name)
    graphs, _ = write_graphs(source, work)
    return Manifest(
        name=name,
        version=version,
        source_package=source.package,
        source_version=source.version,
        source_sha256=source_sha256(source),
        files=_file_hashes(work),
        graphs=graphs,
        vocabulary_file=TOKENIZER_FILE,
        sample_rate=SAMPLE_RATE,
        n_mels=0,  # Moonshine takes the samples themselves
        suppress_ids=[],
        suppress_ids_begin=[],
        tools=_tool_versions(),
        graph_format=MOONSHINE_GRAPH_FORMAT,
        graph_revision=MOONSHINE_GRAPH_REVISION,
        family="moonshine",
    )


def _file_hashes(work: Path) -> dict[str, str]:
    return {p.name: sha256_of(p) for p in sorted(work.iterdir()) if p.is_file()}
