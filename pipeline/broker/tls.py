"""TLS material of the local SASL_SSL broker, made with openssl at its first start.

Under ``<state_dir>/kafka/tls`` (private keys and the key store readable by the owner only):

- ``ca.pem`` / ``ca.key``      a CA of this state folder only: clients trust it (CALLQA_KAFKA_SSL_CA_FILE)
- ``broker.pem`` / ``broker.key`` the broker's certificate, signed by that CA, for 127.0.0.1 and localhost
- ``keystore.pem``             key + certificate chain, the PEM key store Kafka reads (no store password)

The files are made once and reused, so clients keep trusting the same CA across broker restarts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CA_DAYS = 3650
BROKER_DAYS = 825  # the longest validity clients accept for a server certificate
BROKER_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
)


class TlsError(RuntimeError):
    """The broker's certificates could not be made; the message names the openssl step."""


@dataclass(frozen=True)
class BrokerTls:
    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.folder / "keystore.pem"

    def ensure(self) -> BrokerTls:
        """Make the CA and the broker certificate unless a previous start made them."""
        if self.ca_cert.exists() and self.keystore.exists():
            return self
        if shutil.which("openssl") is None:
            raise TlsError("openssl is not on PATH: it makes the local SASL_SSL broker's certificates")
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        f = self.folder
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("make the CA", "req", "-x509", *key, "-keyout", f / "ca.key", "-out", f / "ca.pem",
                 "-days", str(CA_DAYS), "-subj", "/CN=callqa local Kafka CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        _openssl("make the broker key", "req", *key, "-keyout", f / "broker.key", "-out", f / "broker.csr",
                 "-subj", "/CN=localhost")
        (f / "broker.ext").write_text(BROKER_EXTENSIONS)
        _openssl("sign the broker certificate", "x509", "-req", "-in", f / "broker.csr", "-CA", f / "ca.pem",
                 "-CAkey", f / "ca.key", "-CAcreateserial", "-days", str(BROKER_DAYS), "-sha256",
                 "-extfile", f / "broker.ext", "-out", f / "broker.pem")
        # Kafka's PEM key store: the PKCS#8 key, then the chain from the broker's certificate up.
        store = "".join((f / name).read_text() for name in ("broker.key", "broker.pem", "ca.pem"))
        self.keystore.write_text(store)
        for private in ("ca.key", "broker.key", "keystore.pem"):
            os.chmod(f / private, 0o600)
        return self


def _openssl(step: str, *args: str | Path) -> None:
    proc = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-2:]
        raise TlsError(f"openssl could not {step}: " + " | ".join(tail))
