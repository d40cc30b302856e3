"""A finished call's legs laid out from its frames as the live worker heard them (post-call pass)."""

from __future__ import annotations

import numpy as np

from pipeline.audio import codecs
from pipeline.contracts.messages import AudioFrame
from pipeline.postcall.audio import assemble
from tests.postcall.conftest import job_for


def _frame(leg: str, seq: int, value: float) -> AudioFrame:
    payload = codecs.encode(np.full(160, value, dtype=np.float32), "mulaw")
    return AudioFrame("c", leg, seq, seq * 20, 8000, "mulaw", payload)  # type: ignore[arg-type]


def test_frames_are_placed_by_seq_first_copy_kept_gaps_silent_and_frames_past_the_count_ignored() -> None:
    sent = [_frame("agent", 0, 0.5), _frame("agent", 2, -0.25), _frame("agent", 1, 0.125),
            _frame("agent", 2, 0.9),  # a duplicate (a producer's retry): the first copy is the one heard
            _frame("customer", 1, 0.25),  # the customer's first frame was lost: silence
            _frame("agent", 3, 0.7)]  # after the frames the live pass used (its end event said 3)
    job = job_for("c", sent, frame_counts={"agent": 3, "customer": 3})
    audio = assemble(job, sent)

    agent, customer = audio.legs["agent"], audio.legs["customer"]
    assert (agent.frames, agent.missing, customer.frames, customer.missing) == (3, 0, 3, 2)
    assert agent.samples.size == customer.samples.size == 3 * 160
    decoded = {v: float(codecs.decode(codecs.encode(np.float32([v]), "mulaw"), "mulaw")[0]) for v in (0.5, 0.125, -0.25, 0.25)}
    assert np.allclose(agent.samples.reshape(3, 160)[:, 0], [decoded[0.5], decoded[0.125], decoded[-0.25]])
    assert np.all(customer.samples[:160] == 0) and np.all(customer.samples[320:] == 0)
    assert np.allclose(customer.samples[160:320], decoded[0.25])
    assert audio.extra == {"agent": 1}
