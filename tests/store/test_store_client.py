"""URL parsing, client caching and the one-chdb-path-per-process guard."""

from __future__ import annotations

from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from pipeline.store.client import (
    ChdbPathConflictError,
    StoreError,
    check_identifier,
    connect,
    parse_store_url,
)


def test_default_url_is_chdb_under_state_dir(tmp_path: Path) -> None:
    target = parse_store_url("", state_dir=tmp_path / "state")
    assert target.kind == "chdb"
    assert target.chdb_path == str((tmp_path / "state" / "clickhouse").resolve())
    assert Path(target.chdb_path).is_absolute()


def test_relative_state_dir_is_made_absolute() -> None:
    target = parse_store_url("", state_dir=Path(".callqa-relative"))
    assert target.chdb_path is not None and Path(target.chdb_path).is_absolute()


def test_http_url_keeps_credentials_but_hides_them_in_display() -> None:
    target = parse_store_url("https://reader:s3cret@ch.example:8443")
    assert target.kind == "http"
    assert "s3cret" in target.url
    assert "s3cret" not in target.display and "reader" in target.display


@pytest.mark.parametrize("url", ["chdb://relative/path", "mysql://h:3306", "ch.example:8123"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreError):
        parse_store_url(url)


@pytest.mark.parametrize("name", ["callqa; DROP TABLE x", "1abc", "a-b", ""])
def test_identifiers_are_checked(name: str) -> None:
    with pytest.raises(StoreError):
        check_identifier(name)


def test_clients_are_cached_per_url_and_database(store_url: str, database: str) -> None:
    first = connect(store_url, database)
    assert connect(store_url + "/", database) is first  # same path, other spelling
    fresh = connect(store_url, database, fresh=True)
    assert fresh is not first
    assert fresh.command("SELECT currentDatabase()") == database
    fresh.close()
    assert first.command("SELECT 1") == 1  # closing a fresh handle leaves the shared engine alone
    first.command(f"DROP DATABASE {database}")


def test_second_chdb_path_in_one_process_is_refused(store_url: str, tmp_path: Path) -> None:
    connect(store_url, "default", create_database=False)
    with pytest.raises(ChdbPathConflictError, match="one path per process"):
        connect(f"chdb://{tmp_path / 'other'}", "default")


def test_missing_database_without_create_is_a_clear_error(store_url: str, unique_name: str) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        connect(store_url, unique_name, create_database=False)


def test_closed_port_fails_to_connect(closed_port_url: str) -> None:
    with pytest.raises(OperationalError):
        connect(closed_port_url, "callqa")


# Each process below opens the embedded engine itself: chdb takes one data path per process, and the test
# process may hold another. Only Python's stdlib decides what they print.
HOLD_ENGINE = """
import sys, time
from pipeline.store.client import connect
connect(sys.argv[1], "callqa").command("CREATE TABLE IF NOT EXISTS held (x UInt8) ENGINE = MergeTree ORDER BY x")
print("open", flush=True)
sys.stdin.readline()
"""

TAKE_ENGINE = """
import sys
from pipeline.store.client import StoreConnectionError, connect, connect_when_free
try:
    connect(sys.argv[1], "callqa")
    print("opened at once")
except StoreConnectionError as exc:
    print("held:", exc, flush=True)
client = connect_when_free(sys.argv[1], "callqa", 60)
print("opened, tables:", sorted(r[0] for r in client.query("SHOW TABLES").result_rows), flush=True)
"""


def test_a_chdb_path_another_process_holds_is_waited_for_until_that_process_lets_it_go(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"chdb://{tmp_path / 'store'}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_ENGINE, url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "open"
        taker = subprocess.Popen([sys.executable, "-c", TAKE_ENGINE, url], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert taker.stdout is not None
        first = taker.stdout.readline()
        assert first.startswith("held: cannot use ClickHouse at chdb://"), first  # the engine is the holder's
        assert taker.poll() is None  # waiting, not failed
        holder.stdin.write("\n")
        holder.stdin.flush()  # the holder exits, and its engine with it
        out, err = taker.communicate(timeout=60)
        assert taker.returncode == 0, err
        assert out.strip() == "opened, tables: ['held']"
    finally:
        holder.kill()
        holder.wait()
