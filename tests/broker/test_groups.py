"""The session timeout a worker asks for, fitted to what the brokers allow (pipeline/broker/groups.py)."""

from __future__ import annotations

import pytest

from pipeline.broker.groups import fitted_session_timeout, session_timeout_bounds


def test_a_session_outside_the_brokers_bounds_is_moved_to_the_nearest_one() -> None:
    assert fitted_session_timeout(2.0, (6.0, 1800.0)) == 6.0  # a stock broker's minimum
    assert fitted_session_timeout(3600.0, (6.0, 1800.0)) == 1800.0
    assert fitted_session_timeout(15.0, (6.0, 1800.0)) == 15.0
    assert fitted_session_timeout(2.0, None) == 2.0  # bounds unknown: the setting, and the join will say


@pytest.mark.broker
def test_the_local_broker_reports_its_session_bounds(broker: str) -> None:
    from confluent_kafka.admin import AdminClient

    # The local broker lowers group.min.session.timeout.ms to 1 s (a stock broker says 6 s).
    assert session_timeout_bounds(AdminClient({"bootstrap.servers": broker})) == (1.0, 1800.0)
    assert session_timeout_bounds(AdminClient({"bootstrap.servers": "127.0.0.1:1"}), timeout_s=1.0) is None
