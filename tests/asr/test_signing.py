"""Signed model manifests: keygen, sign, and refusal of unsigned, altered or foreign-signed models at load."""

from __future__ import annotations

import json
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from pipeline.asr.build import BuildResult
from pipeline.asr.cli import models_app
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import Manifest, ModelIntegrityError, sha256_of
from pipeline.asr.onnx_model import WhisperOnnx
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.signing import (
    SIGNATURE_FILE,
    ModelSignatureError,
    SigningKeyError,
    generate_key,
    key_id,
    public_key_text,
    sign_model,
)
from pipeline.config import Settings, get_settings


def _trusting(settings: Settings, models_dir: Path, key: Ed25519PrivateKey | str) -> Settings:
    """Settings that require signatures by `key` (int8 graphs: the smaller load, same checks)."""
    public = key if isinstance(key, str) else public_key_text(key.public_key())
    return settings.model_copy(
        update={"models_dir": str(models_dir), "model_public_key": public, "quantization": "int8"}
    )


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "models.key"
    public = generate_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    before = path.read_bytes()
    with pytest.raises(SigningKeyError, match="already exists"):
        generate_key(path)
    assert path.read_bytes() == before  # the key that signed deployed models survives a second keygen
    assert len(key_id(public)) == 16


def test_signed_model_loads_and_unsigned_is_refused_only_when_a_key_is_required(
    tmp_path: Path, asr_settings: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    signed = place_version(tmp_path / "a", 1, key=signing_key)
    unsigned = place_version(tmp_path / "b", 1)
    settings = _trusting(asr_settings, tmp_path / "a", signing_key)
    assert Recognizer.load(signed, settings).version == 1
    with pytest.raises(ModelSignatureError, match=rf"^{unsigned}: refused: missing signature"):
        Recognizer.load(unsigned, settings)
    without_key = settings.model_copy(update={"model_public_key": ""})
    assert Recognizer.load(unsigned, without_key).version == 1  # no trusted key: no signature needed


def test_manifest_rewritten_after_signing_is_refused(
    tmp_path: Path, built: BuildResult, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    """The attack signatures exist for: replace a graph and write a manifest with its new sha256."""
    folder = place_version(tmp_path, 1, key=signing_key)
    WhisperOnnx.load(folder, "int8", 1, signing_key.public_key())  # intact: loads
    (folder / "decoder.int8.onnx").unlink()
    (folder / "decoder.int8.onnx").write_bytes((built.folder / "decoder.int8.onnx").read_bytes() + b"\0")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["decoder.int8.onnx"] = sha256_of(folder / "decoder.int8.onnx")
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    rewritten = Manifest.read(folder)
    rewritten.verify(folder, sorted(rewritten.files))  # the sha256s alone are satisfied: no help here
    with pytest.raises(ModelSignatureError, match=r"refused: bad signature \(manifest\.json changed after signing"):
        WhisperOnnx.load(folder, "int8", 1, signing_key.public_key())


def test_signature_of_another_version_or_by_another_key_is_refused(
    tmp_path: Path, asr_settings: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    v1 = place_version(tmp_path, 1, key=signing_key)
    v2 = place_version(tmp_path, 2)
    (v2 / SIGNATURE_FILE).write_bytes((v1 / SIGNATURE_FILE).read_bytes())  # a valid signature, replayed
    settings = _trusting(asr_settings, tmp_path, signing_key)
    with pytest.raises(ModelSignatureError, match="refused: bad signature"):
        Recognizer.load(v2, settings)
    intruder = Ed25519PrivateKey.generate()
    sign_model(v2, intruder)
    trusted, foreign = key_id(signing_key.public_key()), key_id(intruder.public_key())
    with pytest.raises(ModelSignatureError, match=rf"refused: wrong key \(signed by key {foreign}, trusted key is {trusted}\)"):
        Recognizer.load(v2, settings)
    (v2 / SIGNATURE_FILE).write_text("{not json")
    with pytest.raises(ModelSignatureError, match="refused: bad signature .unreadable signature file"):
        Recognizer.load(v2, settings)


def test_a_signed_old_version_copied_under_a_newer_name_is_refused(
    tmp_path: Path, asr_settings: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    """A rollback: version 1's folder, signature and all, renamed 5 so it is found as the newest."""
    old = place_version(tmp_path, 1, key=signing_key)
    relabelled = shutil.copytree(old, tmp_path / "tiny.en" / "5", symlinks=True)
    with pytest.raises(ModelIntegrityError, match=rf"^{relabelled}: refused: the folder says version 5, its manifest 1$"):
        Engine.load("tiny.en", settings=_trusting(asr_settings, tmp_path, signing_key))


def test_sign_refuses_a_folder_whose_files_already_differ(
    tmp_path: Path, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    folder = place_version(tmp_path, 1)
    (folder / "vocabulary.txt").unlink()
    (folder / "vocabulary.txt").write_text("tampered\n")
    with pytest.raises(ModelIntegrityError, match=r"vocabulary\.txt: sha256 .* does not match"):
        sign_model(folder, signing_key)
    assert not (folder / SIGNATURE_FILE).exists()


def test_trusted_key_setting_takes_base64_a_key_file_or_pem_and_names_itself_when_unusable(
    tmp_path: Path, asr_settings: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    from cryptography.hazmat.primitives import serialization

    folder = place_version(tmp_path, 1, key=signing_key)
    key_file = tmp_path / "trusted.pub"
    key_file.write_text(public_key_text(signing_key.public_key()) + "\n")
    pem_file = tmp_path / "trusted.pem"
    pem_file.write_bytes(signing_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ))
    for value in (str(key_file), str(pem_file)):
        assert Recognizer.load(folder, _trusting(asr_settings, tmp_path, value)).version == 1
    for value in ("not-a-key", str(tmp_path / "missing.pub")):
        with pytest.raises(ModelSignatureError, match="CALLQA_MODEL_PUBLIC_KEY: neither a readable file nor base64"):
            Recognizer.load(folder, _trusting(asr_settings, tmp_path, value))
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("AAAA\n")
    with pytest.raises(ModelSignatureError, match=rf"CALLQA_MODEL_PUBLIC_KEY file {garbage}: not base64 of a 32-byte"):
        Recognizer.load(folder, _trusting(asr_settings, tmp_path, str(garbage)))


def test_engine_refuses_an_unsigned_newest_version_at_start(
    tmp_path: Path, asr_settings: Settings, signing_key: Ed25519PrivateKey, place_version: Callable[..., Path]
) -> None:
    place_version(tmp_path, 1, key=signing_key)
    newest = place_version(tmp_path, 2)
    with pytest.raises(ModelSignatureError, match=rf"^{newest}: refused: missing signature"):
        Engine.load("tiny.en", settings=_trusting(asr_settings, tmp_path, signing_key))


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[typer.Typer]:
    monkeypatch.setenv("CALLQA_MODELS_DIR", str(tmp_path / "models"))
    get_settings.cache_clear()
    app = typer.Typer()
    app.add_typer(models_app, name="models")
    app.command("noop")(lambda: None)  # a second command keeps "models" a subcommand
    yield app
    get_settings.cache_clear()


def test_cli_keygen_then_sign_gives_a_model_the_printed_key_trusts(
    cli: typer.Typer, tmp_path: Path, asr_settings: Settings, place_version: Callable[..., Path]
) -> None:
    folder = place_version(tmp_path / "models", 3)
    key = tmp_path / "keys" / "models.key"
    key.parent.mkdir()
    runner = CliRunner()
    made = runner.invoke(cli, ["models", "keygen", "--key", str(key)])
    assert made.exit_code == 0, made.output
    public = (tmp_path / "keys" / "models.key.pub").read_text().strip()
    assert f"CALLQA_MODEL_PUBLIC_KEY={public}" in made.output
    signed = runner.invoke(cli, ["models", "sign", "tiny.en", "--key", str(key)])  # the newest: 3
    assert signed.exit_code == 0, signed.output
    assert (folder / SIGNATURE_FILE).exists()
    assert Recognizer.load(folder, _trusting(asr_settings, tmp_path / "models", public)).version == 3
    again = runner.invoke(cli, ["models", "keygen", "--key", str(key)])
    assert again.exit_code != 0 and "already exists" in str(again.exception)
