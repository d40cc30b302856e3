"""The health component that notices aiokafka's group coordination task has died (it logs the error
and the consumer goes on fetching nothing)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pipeline.broker.consumer import GroupCoordination, static_member_url


def app_with(task: object) -> SimpleNamespace:
    client = SimpleNamespace(_coordinator=SimpleNamespace(_coordination_task=task))
    return SimpleNamespace(_consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=client)))


async def test_a_dead_coordination_task_is_the_components_error_and_a_running_one_is_not() -> None:
    async def coordinate(fail: bool) -> None:
        if fail:
            raise AssertionError("assignment for another URL")
        await asyncio.sleep(30)

    died = asyncio.ensure_future(coordinate(True))
    running = asyncio.ensure_future(coordinate(False))
    await asyncio.sleep(0)
    try:
        assert isinstance(GroupCoordination(app_with(died)).error, AssertionError)  # type: ignore[arg-type]
        assert GroupCoordination(app_with(running)).error is None  # type: ignore[arg-type]
        assert GroupCoordination(SimpleNamespace(_consumer=None)).error is None  # type: ignore[arg-type]
    finally:
        running.cancel()


def test_a_static_members_url_names_its_instance_whatever_its_address() -> None:
    assert static_member_url("callqa-worker-0") == "http://callqa-worker/callqa-worker-0"
    assert static_member_url("a b/c") == "http://callqa-worker/a%20b%2Fc"
