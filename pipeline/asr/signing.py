"""Ed25519 signatures over model manifests: who built a model folder, not only whether it is intact.

The sha256s in manifest.json say each file is the one the manifest lists; anyone who can write the
folder can also write a new manifest. A signature over the manifest's exact bytes, checked against a
public key the worker trusts (`CALLQA_MODEL_PUBLIC_KEY`), closes that: the signature covers the
manifest, the manifest covers every file. The signature lives next to the manifest in
`manifest.json.sig`: JSON with the algorithm, the signer's key id and the base64 signature.

Keys: `callqa models keygen` writes a PKCS#8 PEM private key (0600) and the public key as one line of
base64 (the raw 32 bytes), which is what the setting takes (or a file holding it, or a PEM public key).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pipeline.asr.manifest import MANIFEST_FILE, Manifest, ModelIntegrityError, read_manifest_bytes
from pipeline.config.asr import AsrSettings

SIGNATURE_FILE = "manifest.json.sig"
ALGORITHM = "ed25519"
KEY_SETTING = "CALLQA_MODEL_PUBLIC_KEY"


class ModelSignatureError(ModelIntegrityError):
    """A model's manifest signature is missing, invalid, made with another key, or cannot be checked."""


class SigningKeyError(ValueError):
    """A private key file that cannot be used for signing (missing, not Ed25519, already exists)."""


def key_id(key: Ed25519PublicKey) -> str:
    """A short name for a public key (first 16 hex digits of the sha256 of its raw bytes)."""
    return hashlib.sha256(public_key_text(key).encode()).hexdigest()[:16]


def public_key_text(key: Ed25519PublicKey) -> str:
    """The raw 32-byte public key as base64: one line, fit for an environment variable."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def generate_key(private_path: Path) -> Ed25519PublicKey:
    """Write a new private key to `private_path` (mode 0600, never over an existing file)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        # O_EXCL: a second keygen must not destroy the key that signed the deployed models;
        # mode 0600 from creation, so the key is never readable by others, not even briefly.
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise SigningKeyError(f"{private_path}: already exists (choose another path)") from exc
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # whatever the umask
        f.write(pem)
    return key.public_key()


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read the signing key ({exc.strerror})") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{path}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path}: a {type(key).__name__}, not an Ed25519 private key")
    return key


def parse_public_key(value: str) -> Ed25519PublicKey:
    """The trusted key from the setting's value: a file (base64 line or PEM), or the base64 itself."""
    text, source = value.strip(), KEY_SETTING
    path = Path(text).expanduser()
    if _is_file(path):
        try:
            text, source = path.read_text().strip(), f"{KEY_SETTING} file {path}"
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelSignatureError(f"{KEY_SETTING} file {path}: unreadable ({exc})") from exc
    if text.startswith("-----BEGIN"):
        return _pem_public_key(text, source)
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        what = "not base64 of" if source != KEY_SETTING else "neither a readable file nor base64 of"
        raise ModelSignatureError(f"{source}: {what} a 32-byte Ed25519 public key") from exc


def trusted_key(settings: AsrSettings) -> Ed25519PublicKey | None:
    """The key model signatures must verify with, or None when signatures are not required."""
    return parse_public_key(settings.model_public_key) if settings.model_public_key.strip() else None


def sign_model(folder: Path, key: Ed25519PrivateKey) -> Path:
    """Sign the folder's manifest after checking every file it lists; returns the signature file."""
    data = read_manifest_bytes(folder)
    manifest = Manifest.parse(data, folder / MANIFEST_FILE)
    # Never vouch for a folder whose files already differ from its manifest.
    manifest.verify(folder, sorted(manifest.files))
    document = {
        "algorithm": ALGORITHM,
        "key_id": key_id(key.public_key()),
        "signature": base64.b64encode(key.sign(data)).decode(),
    }
    target = folder / SIGNATURE_FILE
    staging = folder / f".{SIGNATURE_FILE}.tmp"
    staging.write_text(json.dumps(document, indent=2) + "\n")
    staging.chmod(0o644)
    os.replace(staging, target)  # a watcher sees no signature or the whole one, never half
    return target


def verify_signature(folder: Path, manifest_bytes: bytes, key: Ed25519PublicKey) -> None:
    """Refuse the folder unless `manifest_bytes` carry a valid signature by `key`."""
    path = folder / SIGNATURE_FILE
    try:
        document = json.loads(path.read_bytes())
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        claimed_id = str(document.get("key_id", "?"))
        signature = base64.b64decode(document["signature"], validate=True)
    except FileNotFoundError as exc:
        raise ModelSignatureError(
            f"{folder}: refused: missing signature ({SIGNATURE_FILE}), and {KEY_SETTING} requires one "
            f"(run: callqa models sign {folder.parent.name} --version {folder.name} --key FILE)"
        ) from exc
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ModelSignatureError(f"{path}: refused: bad signature (unreadable signature file: {exc})") from exc
    try:
        key.verify(signature, manifest_bytes)
    except InvalidSignature as exc:
        trusted = key_id(key)
        # The claimed key id is unauthenticated: it only chooses the message, never the verdict.
        if claimed_id != trusted:
            raise ModelSignatureError(
                f"{folder}: refused: wrong key (signed by key {claimed_id}, trusted key is {trusted})"
            ) from exc
        raise ModelSignatureError(
            f"{folder}: refused: bad signature ({MANIFEST_FILE} changed after signing, or the signature is corrupt)"
        ) from exc


def signer_id(folder: Path) -> str | None:
    """The key id a folder's signature file claims (unverified), or None when it has none."""
    try:
        return str(json.loads((folder / SIGNATURE_FILE).read_bytes()).get("key_id", "?"))
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError):
        return "unreadable"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a base64 key or an inline PEM is no valid path (too long, odd characters)
        return False


def _pem_public_key(text: str, source: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError as exc:
        raise ModelSignatureError(f"{source}: not a PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ModelSignatureError(f"{source}: a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_trusted_manifest(
    folder: Path, quantization: str, trusted_key: Ed25519PublicKey | None
) -> tuple[Manifest, dict[str, str]]:
    """A model folder's manifest and its ``quantization`` graphs, after checking the signature (given a key),
    that the folder's name is the manifest's version, and the sha256 of every file the graphs need."""
    data = read_manifest_bytes(folder)
    if trusted_key is not None:
        verify_signature(folder, data, trusted_key)
    # Parsed from the bytes just verified: re-reading the file would let it change in between.
    manifest = Manifest.parse(data, folder / MANIFEST_FILE)
    if folder.name.isdigit() and int(folder.name) != manifest.version:
        # Versions are found by folder name: an old (even validly signed) version copied under a
        # newer name would otherwise be loaded as the newest at the next start.
        raise ModelIntegrityError(
            f"{folder}: refused: the folder says version {folder.name}, its manifest {manifest.version}"
        )
    graphs = manifest.graphs.get(quantization)
    if graphs is None:
        raise ModelIntegrityError(f"{folder}: no {quantization!r} graphs (have {sorted(manifest.graphs)}): built "
                                  f"before that variant; `callqa models build {manifest.name}` builds a version with it")
    manifest.verify(folder, [graphs["encoder"], graphs["decoder"], manifest.vocabulary_file])
    return manifest, graphs
