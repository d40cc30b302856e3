"""The worker's call core without Kafka: concurrent agents must share one state per call."""

from __future__ import annotations

import asyncio

from pipeline.config import Settings
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor


async def test_two_agents_opening_the_same_call_at_once_share_one_state() -> None:
    async def slow_store_lookup(call_id: str) -> bool:
        await asyncio.sleep(0.01)  # both agents are suspended here at the same time
        return False

    settings = Settings()
    # _call_for touches neither the batcher, Kafka nor the store: those ports stay unset here.
    processor = CallProcessor(settings, None, None, None, None, QaConfig.from_settings(settings),  # type: ignore[arg-type]
                              is_finished_elsewhere=slow_store_lookup)
    a, b = await asyncio.gather(processor._call_for("c1"), processor._call_for("c1"))
    assert a is not None and a is b
    assert processor.calls == {"c1": a}
