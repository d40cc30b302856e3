"""The local default: a loopback worker's token file, the CLI reading it, the off-loopback refusal; and the
call pages' session cookie."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.api.auth import ApiAuth, ApiConfigError, check_api_settings, with_local_token
from pipeline.api.sessions import new_session, session_key, session_valid
from pipeline.api.token_file import TokenFileError, ensure_token_file, read_token_file, token_path
from pipeline.config import Settings
from pipeline.report import api_token

TOKEN = "s" * 40  # noqa: S105 - a test token


def test_the_token_file_is_made_once_private_and_reused(tmp_path: Path) -> None:
    path = token_path(tmp_path / "state")
    assert read_token_file(path) is None
    made = ensure_token_file(path)
    assert len(made) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token_file(path) == made == read_token_file(path)


def test_a_token_file_others_can_read_or_too_short_is_refused(tmp_path: Path) -> None:
    path = token_path(tmp_path)
    ensure_token_file(path)
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match=r"open to other users \(mode 0644\)"):
        read_token_file(path)
    path.unlink()
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match="5 characters"):
        ensure_token_file(path)


def test_a_loopback_worker_without_a_token_uses_the_file_and_local_commands_read_it(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, web_host="127.0.0.1", api_token="")
    assert api_token(settings) == ""  # no worker has made one yet
    local = with_local_token(settings)
    token = local.api_token.get_secret_value()
    assert token == read_token_file(token_path(tmp_path))
    check_api_settings(local)
    assert ApiAuth.from_settings(local).refusal(f"Bearer {token}") is None
    assert api_token(settings) == token  # `callqa report` finds it
    assert api_token(Settings(state_dir=tmp_path, api_token=TOKEN)) == TOKEN  # a configured token wins


@pytest.mark.parametrize("overrides", [{"api_token": TOKEN}, {"api_auth": "off"}, {"web_host": "0.0.0.0"}])
def test_no_token_file_unless_a_loopback_worker_needs_one(tmp_path: Path, overrides: dict[str, str]) -> None:
    settings = Settings(**{"state_dir": tmp_path, "web_host": "127.0.0.1", "api_token": "", **overrides})
    assert with_local_token(settings) is settings
    assert not token_path(tmp_path).exists()


def test_an_exposed_worker_needs_an_explicit_token() -> None:
    with pytest.raises(ApiConfigError, match=r"^CALLQA_WEB_HOST '0.0.0.0' is not a loopback address: set CALLQA_API_TOKEN"):
        check_api_settings(Settings(web_host="0.0.0.0", api_token=""))
    check_api_settings(Settings(web_host="0.0.0.0", api_token=TOKEN))


@pytest.mark.slow
def test_the_worker_command_refuses_to_start_exposed_without_a_token(tmp_path: Path) -> None:
    """Checked before the worker touches Kafka or the store: no broker is needed."""
    env = {k: v for k, v in os.environ.items() if k != "CALLQA_API_TOKEN"}
    env.update(CALLQA_WEB_HOST="0.0.0.0", CALLQA_STATE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "worker"], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "is not a loopback address: set CALLQA_API_TOKEN" in lines[0]
    assert not token_path(tmp_path).exists()


def test_a_session_cookie_is_signed_opaque_and_expires() -> None:
    key = session_key(ApiAuth.from_settings(Settings(api_token=TOKEN)).token_digest)
    value = new_session(key, now_s=1_000.0, ttl_s=60.0)
    assert TOKEN not in value and session_valid(key, value, now_s=1_059.0)
    assert not session_valid(key, value, now_s=1_060.0)  # expired
    expires, nonce, mac = value.split(".")
    assert not session_valid(key, f"{int(expires) + 3600}.{nonce}.{mac}", now_s=1_000.0)  # a longer life, forged
    assert not session_valid(key, f"{expires}.{nonce}x.{mac}", now_s=1_000.0)
    other = session_key(ApiAuth.from_settings(Settings(api_token="o" * 40)).token_digest)
    assert not session_valid(other, value, now_s=1_000.0)  # a new token ends every session
    for junk in (None, "", "a.b", "a.b.c.d", value.replace(".", "")):
        assert not session_valid(key, junk, now_s=1_000.0)


def test_the_login_check_accepts_only_the_token() -> None:
    auth = ApiAuth.from_settings(Settings(api_token=TOKEN))
    assert auth.token_matches(TOKEN) and auth.token_matches(f" {TOKEN}\n")
    for wrong in ("", TOKEN[:-1], TOKEN + "x", "x" * 40):
        assert not auth.token_matches(wrong)
    assert not ApiAuth.from_settings(Settings(api_token="")).token_matches("")
    assert auth.page_allowed(auth.new_session(0.0), None, now_s=1.0)
    assert auth.page_allowed(None, f"Bearer {TOKEN}", now_s=1.0)
    assert not auth.page_allowed(None, None, now_s=1.0)
    assert not auth.page_allowed(auth.new_session(0.0), None, now_s=auth.session_ttl_s + 1)
