"""Accounts in the store: a name is one account across every tenant (adding it again is refused and the account
keeps its tenant and token), each account has an id of its own that a later account of the same name never
gets, and accounts written before ids existed get a stable one."""

from __future__ import annotations

import hashlib
import threading

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.access.users import (
    AccountExistsError,
    Principal,
    account_principal,
    add_account,
    list_accounts,
    login,
    principal_of,
    remove_account,
    set_password,
)
from pipeline.store.client import connect
from pipeline.store.migrations import MIGRATIONS, migrate


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_a_name_taken_in_another_tenant_is_refused_and_the_account_stays_as_it_was(store: Client,
                                                                                     unique_name: str) -> None:
    token = add_account(store, unique_name, "bob", "supervisor", "acme")
    with pytest.raises(AccountExistsError, match=r"^account name 'bob' is taken \(names are unique across tenants\)"):
        add_account(store, unique_name, "bob", "admin", "other")
    with pytest.raises(AccountExistsError):
        add_account(store, unique_name, "bob", "supervisor", "acme")  # the same tenant: no silent new token
    bob = principal_of(store, unique_name, _digest(token))
    assert bob is not None and (bob.name, bob.role, bob.tenant) == ("bob", "supervisor", "acme")
    [listed] = list_accounts(store, unique_name)
    assert (listed.tenant, listed.account_id) == ("acme", bob.account_id) and len(bob.account_id) == 32


def test_a_name_removed_and_added_again_is_another_account(store: Client, unique_name: str) -> None:
    old_token = add_account(store, unique_name, "bob", "supervisor", "acme")
    old = principal_of(store, unique_name, _digest(old_token))
    assert old is not None and account_principal(store, unique_name, old.account_id) == old
    remove_account(store, unique_name, "bob")
    assert account_principal(store, unique_name, old.account_id) is None
    new_token = add_account(store, unique_name, "bob", "admin", "other")
    new = principal_of(store, unique_name, _digest(new_token))
    assert new is not None and new.tenant == "other" and new.account_id != old.account_id
    assert account_principal(store, unique_name, old.account_id) is None  # the old id never becomes the new bob
    assert principal_of(store, unique_name, _digest(old_token)) is None
    assert account_principal(store, unique_name, "") is None


def test_a_password_keeps_the_accounts_id_and_the_login_names_it(store: Client, unique_name: str) -> None:
    token = add_account(store, unique_name, "ann", "agent", "acme", "agent-1")
    before = principal_of(store, unique_name, _digest(token))
    set_password(store, unique_name, "ann", "a long password")
    who = login(store, unique_name, "ann", "a long password")
    assert who is not None and before is not None and who == before
    assert login(store, unique_name, "ann", "not the password") is None


def test_adds_of_one_name_at_once_make_one_account(store: Client, unique_name: str) -> None:
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def add(tenant: str) -> None:
        start.wait()
        try:
            add_account(store, unique_name, "eve", "admin", tenant)
            outcomes.append("added")
        except AccountExistsError:
            outcomes.append("taken")

    threads = [threading.Thread(target=add, args=(f"tenant-{n}",)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["added"] + ["taken"] * 5
    assert len(list_accounts(store, unique_name)) == 1


def test_accounts_made_before_ids_get_a_stable_id_of_their_own(chdb_path: str, unique_name: str) -> None:
    client = connect(f"chdb://{chdb_path}", unique_name)
    try:
        migrate(client, unique_name, tuple(m for m in MIGRATIONS if m.version < 17))
        client.command(f"INSERT INTO {unique_name}.users (name, role, tenant, agent_id, token_sha256, removed, "
                       "created_at, updated_at) VALUES ('old', 'admin', 'acme', '', 'd', 0, "
                       "'2026-01-01 00:00:00', '2026-01-01 00:00:00'), ('older', 'admin', 'acme', '', 'e', 0, "
                       "'2026-01-01 00:00:00', '2026-01-01 00:00:00')")
        migrate(client, unique_name)
        old, older = list_accounts(client, unique_name)
        assert len(old.account_id) == 32 and old.account_id != older.account_id
        set_password(client, unique_name, "old", "a long password")  # rewrites the row: the id goes with it
        assert list_accounts(client, unique_name)[0].account_id == old.account_id
        assert account_principal(client, unique_name, old.account_id) == Principal("old", "admin", "acme", "",
                                                                                  old.account_id)
    finally:
        client.command(f"DROP DATABASE IF EXISTS {unique_name}")

