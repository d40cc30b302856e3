"""ClickHouse over https with the CA settings, and no password in any error.

No modern ClickHouse server can be had on this machine (Debian's 18.16 cannot even serve
clickhouse-connect), so the server here is a STAND-IN: a small Python https server on 127.0.0.1 with a
certificate signed by a CA made in the test with openssl. It records each HTTP request that got
through TLS and answers with a ClickHouse-style error, which is enough to tell "the client trusted the
certificate and sent its query" from "the client refused the certificate".
"""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.store.client import (
    StoreConnectionError,
    StoreError,
    StoreTlsError,
    TlsOptions,
    connect,
    parse_store_url,
)

PASSWORD = "s3cret-Pa55"  # noqa: S105 - the test's own, looked for in every error


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    return cert, key


def _make_leaf(folder: Path, name: str, ca: tuple[Path, Path], usage: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (folder / f"{name}{s}" for s in (".pem", ".key", ".csr", ".ext"))
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", csr, "-subj", f"/CN={name}")
    ext.write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\nsubjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-days", "2",
             "-extfile", ext, "-out", cert)
    return cert, key


@dataclass
class StandIn:
    url: str
    ca: Path
    other_ca: Path
    client_cert: tuple[Path, Path]
    requests: list[dict[str, str]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        self.server.seen.append({**{k.lower(): v for k, v in self.headers.items()},  # type: ignore[attr-defined]
                                 "peer_cn": str(peer.get("subject", "")) if peer else ""})
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"Code: 516. DB::Exception: stand-in, not a ClickHouse server. (AUTHENTICATION_FAILED)\n"
        self.send_response(500)
        self.send_header("X-ClickHouse-Exception-Code", "516")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:  # keep pytest's output clean
        pass


def _serve(tmp: Path, require_client_cert: bool) -> Iterator[StandIn]:
    ca = _make_ca(tmp, "ca")
    other_ca = _make_ca(tmp, "other-ca")
    server_cert = _make_leaf(tmp, "server", ca, "serverAuth")
    client_cert = _make_leaf(tmp, "client", ca, "clientAuth")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*server_cert)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(ca[0])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    seen: list[dict[str, str]] = []
    httpd.seen = seen  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield StandIn(f"https://reader:{PASSWORD}@127.0.0.1:{httpd.server_address[1]}", ca[0], other_ca[0],
                      client_cert, seen)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    yield from _serve(tmp_path, require_client_cert=False)


@pytest.fixture
def mutual_stand_in(tmp_path: Path) -> Iterator[StandIn]:
    yield from _serve(tmp_path, require_client_cert=True)


def test_with_the_ca_setting_the_client_gets_past_tls(stand_in: StandIn) -> None:
    """Also the https-on-any-port check: the stand-in's port is not 8443, and it speaks TLS only."""
    with pytest.raises(StoreConnectionError) as caught:  # the stand-in answers every query with an error
        connect(stand_in.url, "callqa", fresh=True, tls=TlsOptions(ca_cert=str(stand_in.ca)))
    assert not isinstance(caught.value, StoreTlsError)
    assert "stand-in, not a ClickHouse server" in str(caught.value)
    assert stand_in.requests, "no HTTP request reached the server"
    user = stand_in.requests[0].get("x-clickhouse-user") or stand_in.requests[0].get("authorization", "")
    assert user  # the account's credentials travelled inside TLS
    assert PASSWORD not in str(caught.value) and "reader:***@" in str(caught.value)


@pytest.mark.parametrize("which", ["system CAs", "another CA"])
def test_without_the_right_ca_the_certificate_is_refused_in_one_line(stand_in: StandIn, which: str) -> None:
    tls = TlsOptions() if which == "system CAs" else TlsOptions(ca_cert=str(stand_in.other_ca))
    with pytest.raises(StoreTlsError) as caught:
        connect(stand_in.url, "callqa", fresh=True, tls=tls)
    message = str(caught.value)
    assert "\n" not in message and "certificate" in message and "CALLQA_CLICKHOUSE_CA_CERT" in message
    assert PASSWORD not in message and "https://reader:***@127.0.0.1:" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained original
    assert stand_in.requests == []  # nothing was sent over an untrusted connection


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_verify_off_skips_the_check(stand_in: StandIn) -> None:
    with pytest.raises(StoreConnectionError) as caught:
        connect(stand_in.url, "callqa", fresh=True, tls=TlsOptions(verify=False))
    assert not isinstance(caught.value, StoreTlsError) and stand_in.requests


def test_a_client_certificate_is_presented_when_configured(mutual_stand_in: StandIn) -> None:
    cert, key = mutual_stand_in.client_cert
    with pytest.raises(StoreConnectionError) as caught:
        connect(mutual_stand_in.url, "callqa", fresh=True,
                tls=TlsOptions(ca_cert=str(mutual_stand_in.ca), client_cert=str(cert), client_key=str(key)))
    assert not isinstance(caught.value, StoreTlsError)
    assert "client" in mutual_stand_in.requests[0]["peer_cn"]


def test_a_missing_ca_file_is_named(stand_in: StandIn, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="CALLQA_CLICKHOUSE_CA_CERT: no such file"):
        connect(stand_in.url, "callqa", fresh=True, tls=TlsOptions(ca_cert=str(tmp_path / "nope.pem")))


@pytest.mark.parametrize("url", [f"htps://reader:{PASSWORD}@ch.example:8443",
                                 f"chdb://reader:{PASSWORD}@relative/path"])
def test_a_bad_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        parse_store_url(url)
    assert PASSWORD not in str(caught.value) and "reader:***@" in str(caught.value)
    assert PASSWORD not in repr(parse_store_url(f"https://reader:{PASSWORD}@ch.example:8443"))


def test_settings_print_the_store_urls_masked() -> None:
    from pipeline.config import Settings

    settings = Settings(clickhouse_url=f"https://writer:{PASSWORD}@ch.example:8443",
                        clickhouse_readonly_url=f"https://reader:{PASSWORD}@ch.example:8443")
    assert settings.reader_url == f"https://reader:{PASSWORD}@ch.example:8443"
    printed = " ".join(" ".join(row) for row in settings.describe())
    assert PASSWORD not in printed and "CALLQA_CLICKHOUSE_READONLY_URL" in printed
