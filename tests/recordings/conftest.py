"""Fixtures of the recordings' tests: the hidden-digit call, made of two library calls' turns, and what must not
be heard in its recording."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording

RATE = 8000
# Heard in the recording's transcript, any of these is a leak (numbers as the recogniser writes them too).
HIDDEN = {
    "card number": ("4111", "1111", "four one one", "one one one one"),
    "expiry": ("0928", "09/28", "928", "nine twenty"),
    "security code": ("321", "three two one"),
    "date of birth": ("second of july", "july", "1990", "nineteen ninety"),
    "address": ("maple", "twenty two", "22 "),
}
# The rest of the call: still there.
KEPT = ("harbor mutual", "car insurance", "card number", "expiration date", "security code", "payment went through",
        "new address", "phone number")


def hidden_digit_call() -> CallRecording:
    """02_card_payment's first 47 s (date of birth, card number, expiry, security code; the payment confirmed),
    then 01_address_change's new address, read back by the agent (24.0-36.6 s)."""
    options = ReplayOptions(encoding="mulaw")
    card = load_recording(LIBRARY_DIR / "02_card_payment.wav", options)
    address = load_recording(LIBRARY_DIR / "01_address_change.wav", options)
    legs = {leg: np.concatenate([card.legs[leg][: 47 * RATE], address.legs[leg][24 * RATE: int(36.6 * RATE)]])
            for leg in ("agent", "customer")}
    rec = CallRecording("hidden digits", legs, RATE)
    rec.encode("mulaw")
    return rec


@pytest.fixture(scope="session")
def hidden_call() -> CallRecording:
    return hidden_digit_call()


def leaks(text: str) -> list[str]:
    """What of HIDDEN the text says: 'kind: what' each."""
    low = f" {text.lower()} "
    return [f"{kind}: {w}" for kind, words in HIDDEN.items() for w in words if w in low]
