"""`callqa users add|list|remove` on the store (no worker running): the token is printed once, on the last line,
and only its SHA-256 is kept; the list never shows it; a bad role or a missing agent id is refused."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.access.users import AccountError, principal_of
from pipeline.broker.local import free_port
from pipeline.cli import app
from pipeline.config import get_settings
from pipeline.store.client import connect


@pytest.fixture
def env(chdb_path: str, unique_name: str) -> Iterator[dict[str, str]]:
    yield {"CALLQA_CLICKHOUSE_URL": f"chdb://{chdb_path}", "CALLQA_CLICKHOUSE_DATABASE": unique_name,
           "CALLQA_WEB_PORT": str(free_port()), "COLUMNS": "200"}
    connect(f"chdb://{chdb_path}", unique_name).command(f"DROP DATABASE IF EXISTS {unique_name}")


def _users(args: list[str], env: dict[str, str]) -> Any:
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, ["users", *args], env=env)
    finally:
        get_settings.cache_clear()


def test_add_list_remove(env: dict[str, str], chdb_path: str, unique_name: str) -> None:
    added = _users(["add", "ann", "--role", "agent", "--tenant", "acme", "--agent-id", "agent-1"], env)
    assert added.exit_code == 0, added.output
    token = added.output.strip().splitlines()[-1]
    assert len(token) >= 40
    client = connect(f"chdb://{chdb_path}", unique_name)
    principal = principal_of(client, unique_name, hashlib.sha256(token.encode()).hexdigest())
    assert principal is not None and (principal.role, principal.tenant, principal.agent_id) == ("agent", "acme",
                                                                                                  "agent-1")
    assert principal.scope is not None and principal.scope.agent_id == "agent-1"
    assert client.query("SELECT count() FROM users WHERE position(token_sha256, {t:String}) > 0",
                        parameters={"t": token}).result_rows == [(0,)]

    listed = _users(["list", "--json"], env)
    assert listed.exit_code == 0, listed.output
    [account] = json.loads(listed.output)
    assert account["name"] == "ann" and token not in listed.output

    refused = _users(["add", "bob", "--role", "owner", "--tenant", "acme"], env)
    assert isinstance(refused.exception, AccountError) and "role 'owner'" in str(refused.exception)
    no_agent = _users(["add", "bob", "--role", "agent", "--tenant", "acme"], env)
    assert isinstance(no_agent.exception, AccountError) and "--agent-id" in str(no_agent.exception)

    assert _users(["remove", "ann"], env).exit_code == 0
    assert principal_of(client, unique_name, hashlib.sha256(token.encode()).hexdigest()) is None
    assert json.loads(_users(["list", "--json"], env).output) == []


def test_adding_a_name_another_tenant_holds_is_refused_in_one_line(env: dict[str, str], chdb_path: str,
                                                                    unique_name: str) -> None:
    first = _users(["add", "bob", "--role", "supervisor", "--tenant", "acme"], env)
    assert first.exit_code == 0, first.output
    token = first.output.strip().splitlines()[-1]
    taken = _users(["add", "bob", "--role", "admin", "--tenant", "other"], env)
    assert isinstance(taken.exception, AccountError)
    assert str(taken.exception) == ("account name 'bob' is taken (names are unique across tenants): choose another, "
                                    "or remove that account first")
    bob = principal_of(connect(f"chdb://{chdb_path}", unique_name), unique_name,
                       hashlib.sha256(token.encode()).hexdigest())
    assert bob is not None and (bob.role, bob.tenant) == ("supervisor", "acme")  # its token and tenant kept
