"""The worker's store opening on its own thread (a standby taking over joins its group meanwhile): the sink's
client comes once the store is migrated, and a store that cannot be opened is said, not waited for forever."""

from __future__ import annotations

import socket

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from pipeline.config import Settings
from pipeline.worker.store_opening import StoreOpening


def test_the_sinks_client_comes_once_the_store_is_migrated(chdb_path: str, unique_name: str) -> None:
    opening = StoreOpening(Settings(clickhouse_url=f"chdb://{chdb_path}", clickhouse_database=unique_name))
    client = opening.writer_client()  # waits for the opening
    try:
        assert opening.error is None
        assert client.query(f"EXISTS TABLE {unique_name}.segments").result_rows == [(1,)]
    finally:
        client.close()


def test_a_store_that_cannot_be_opened_is_the_openings_error(unique_name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    opening = StoreOpening(Settings(clickhouse_url=f"http://default:secret@127.0.0.1:{port}",
                                    clickhouse_database=unique_name, store_connect_timeout_s=2))
    with pytest.raises(OperationalError, match=f"127.0.0.1:{port}"):
        opening.wait()
    assert isinstance(opening.error, OperationalError)  # what the worker's health reports, and exits on
    assert "secret" not in str(opening.error)
    with pytest.raises(OperationalError):
        opening.writer_client()
