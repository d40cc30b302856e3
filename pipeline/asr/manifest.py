"""The manifest of a built model folder (models/<name>/<version>/manifest.json) and its integrity check."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_FILE = "manifest.json"
# Bumped whenever the graphs' inputs/outputs change: a folder built with another format is rebuilt.
# 4: the decoder step takes positions and self_mask (prompts of any length), and top_k (beam search).
GRAPH_FORMAT = 4
# Bumped when pipeline/asr/graph.py changes the graphs but not their inputs and outputs (GRAPH_FORMAT):
# an older build still loads, and `callqa models build --if-needed` builds a newer version to get it.
# 1: attention scores as k·qᵀ, LogSoftmax instead of ReduceLogSumExp (same tokens, faster steps).
GRAPH_REVISION = 1
# Moonshine folders (pipeline/asr/moonshine_graphs.py) have formats of their own: 1: fp32 graphs with
# the weight casts folded and a cross-attention mask; the shipped tokenizer.bin. 2: tiny-en's own mask
# term replaced by ours (it failed on segments over 10 s). Revision 2: an ``int8row`` variant beside fp32.
MOONSHINE_GRAPH_FORMAT = 2
MOONSHINE_GRAPH_REVISION = 2
FAMILY_FORMATS = {"whisper": (GRAPH_FORMAT, GRAPH_REVISION), "moonshine": (MOONSHINE_GRAPH_FORMAT, MOONSHINE_GRAPH_REVISION)}


def current_format(family: str) -> tuple[int, int]:
    """(graph format, graph revision) this code builds for a model family (whisper, moonshine)."""
    return FAMILY_FORMATS.get(family, (GRAPH_FORMAT, GRAPH_REVISION))


class ModelIntegrityError(RuntimeError):
    """A built model file is missing, altered, or does not match its manifest."""


class ModelNotBuiltError(RuntimeError):
    """No built model of that name exists in the models folder."""


class ModelFormatError(ModelIntegrityError):
    """A model folder was built for other graph inputs/outputs than this code runs (rebuild it)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What a built model folder holds and where it came from."""

    name: str
    version: int
    source_package: str
    source_version: str
    source_sha256: str
    files: dict[str, str]  # file name -> sha256
    graphs: dict[str, dict[str, str]]  # quantization -> {"encoder": file, "decoder": file}
    vocabulary_file: str
    sample_rate: int
    n_mels: int
    suppress_ids: list[int]
    suppress_ids_begin: list[int]
    tools: dict[str, str] = field(default_factory=dict)
    graph_format: int = 0
    graph_revision: int = 0
    family: str = "whisper"  # whisper | moonshine: which loader and decoder the folder is for

    @property
    def format_current(self) -> bool:
        """Built for the graph format this code loads (an older one is rebuilt by Engine.load)."""
        return self.graph_format == current_format(self.family)[0]

    def write(self, folder: Path) -> None:
        (folder / MANIFEST_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        return cls.parse(read_manifest_bytes(folder), folder / MANIFEST_FILE)

    @classmethod
    def parse(cls, data: bytes, path: Path) -> Manifest:
        """The manifest from bytes already read (the very bytes a signature was checked against)."""
        try:
            return cls(**json.loads(data))
        except (TypeError, ValueError) as exc:
            raise ModelIntegrityError(f"{path}: manifest unreadable ({exc})") from exc

    def verify(self, folder: Path, names: list[str]) -> None:
        """Refuse the folder unless its graph format is this code's and each named file exists and has
        the sha256 the manifest records."""
        if not self.format_current:
            raise ModelFormatError(
                f"{folder}: graph format {self.graph_format}, this callqa needs {current_format(self.family)[0]} "
                f"(run: callqa models build {self.name})"
            )
        for name in names:
            expected = self.files.get(name)
            path = folder / name
            if expected is None:
                raise ModelIntegrityError(f"{path}: not listed in the manifest")
            if not path.exists():
                raise ModelIntegrityError(f"{path}: missing")
            actual = sha256_of(path)
            if actual != expected:
                raise ModelIntegrityError(
                    f"{path}: sha256 {actual[:12]}… does not match manifest {expected[:12]}… (file altered?)"
                )


def read_manifest_bytes(folder: Path) -> bytes:
    path = folder / MANIFEST_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise ModelIntegrityError(f"{path}: manifest missing") from exc
    except OSError as exc:
        raise ModelIntegrityError(f"{path}: manifest unreadable ({exc.strerror})") from exc


def model_versions(models_dir: Path, name: str) -> list[int]:
    """Versions of `name` with a manifest, ascending."""
    folder = models_dir / name
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / MANIFEST_FILE).exists())


def latest_model_folder(models_dir: Path, name: str) -> Path:
    versions = model_versions(models_dir, name)
    if not versions:
        raise ModelNotBuiltError(
            f"model {name!r} is not built in {models_dir} (run: callqa models build {name})"
        )
    return models_dir / name / str(versions[-1])
