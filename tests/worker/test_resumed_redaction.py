"""A call resumed from its checkpoint redacts what follows as the call that was never interrupted does.

The checkpoint keeps the redacted text only ("[PAN]", "[PASSWORD]"), so what that text no longer says rides
beside it: whether the whole card number was given (the expiry after it is an expiry, not more card), and
the values said as words, by digest (their read-back is redacted after the resume too). No Kafka here: the
checkpoint goes through the topic's Avro encoding and the registry's resume, as a worker's would.
"""

from __future__ import annotations

from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.worker.checkpoints import MemoryCheckpointStore, call_checkpoint
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.registry import CallRegistry
from pipeline.worker.state import CallState

CALL = "resume-redaction"
# (leg, start ms, text) up to the checkpoint, then after it with what each must be stored as (by hand).
CARD_BEFORE = [("agent", 0, "Can I have the card number please?"),
               ("customer", 3_000, "Sure, it's 4111 1111 1111 1111.")]
CARD_AFTER = [("customer", 7_000, "Oh four twenty seven.", "[EXPIRY].")]
PASSWORD_BEFORE = [("agent", 0, "And your security password for the account?"),
                   ("customer", 3_000, "It's purple falcon.")]
PASSWORD_AFTER = [("agent", 7_000, "Thank you, purple falcon is right.", "Thank you, [PASSWORD] is right.")]


def _segment(i: int, leg: str, start_ms: int, text: str) -> Segment:
    return Segment(CALL, leg, f"{CALL}/{leg}/{i:09d}", start_ms, start_ms + 2_000, text)  # type: ignore[arg-type]


async def _resumed(checkpoint: CallCheckpoint, config: QaConfig) -> CallAnalyzer:
    serde = Serde.from_settings()
    store = MemoryCheckpointStore()
    await (await store.save(3, CALL, serde.decode(serde.encode(checkpoint), CallCheckpoint)))
    settings = Settings(topic_audio="audio", topic_call_events="events")
    registry = CallRegistry(settings, config, lambda rate, encoding: None, store, WorkerMetrics())  # type: ignore[arg-type,return-value]
    call = await registry.call_for(CALL, ("audio", 3))
    assert call is not None and call.analyzer is not None
    return call.analyzer


async def _same_after_resume(before: list[tuple[str, int, str]], after: list[tuple[str, int, str, str]]) -> CallCheckpoint:
    config = QaConfig.from_settings(Settings())
    live = CallState(CALL)
    live.analyzer = CallAnalyzer(CALL, config)
    for i, s in enumerate(before):
        live.analyzer.process(_segment(i, *s))
    checkpoint = call_checkpoint(live, "open")
    resumed = await _resumed(checkpoint, config)
    for i, (leg, start, text, expected) in enumerate(after, start=len(before)):
        assert live.analyzer.process(_segment(i, leg, start, text)).redacted.segment.text == expected
        assert resumed.process(_segment(i, leg, start, text)).redacted.segment.text == expected
    return checkpoint


async def test_the_expiry_after_a_whole_card_number_stays_an_expiry_after_a_resume() -> None:
    checkpoint = await _same_after_resume(CARD_BEFORE, CARD_AFTER)
    assert checkpoint.card_given and [s.text for s in checkpoint.segments][1] == "Sure, it's [PAN]."
    assert "1111" not in repr(checkpoint)  # the fact, never the digits


async def test_a_password_read_back_after_a_resume_is_redacted() -> None:
    checkpoint = await _same_after_resume(PASSWORD_BEFORE, PASSWORD_AFTER)
    assert len(checkpoint.said_values) == 1 and checkpoint.said_values[0].startswith("PASSWORD:2:")
    assert "falcon" not in repr(checkpoint)  # a digest, never the words


async def test_another_call_with_the_same_password_does_not_match_its_digest() -> None:
    config = QaConfig.from_settings(Settings())
    first, second = CallAnalyzer("call-a", config), CallAnalyzer("call-b", config)
    for analyzer in (first, second):
        analyzer.process(Segment(analyzer.call_id, "agent", f"{analyzer.call_id}/a/0", 0, 2_000,
                                 "What is your security password?"))
        analyzer.process(Segment(analyzer.call_id, "customer", f"{analyzer.call_id}/c/0", 3_000, 5_000,
                                 "It's purple falcon."))
    # Salted by the call: the same words give another digest in another call.
    assert first.redaction_memory().said != second.redaction_memory().said
