"""Property-based fuzzing of what the gateway takes from the internet: Twilio Media Streams messages,
AudioHook messages and audio, and both protocols' handshake credentials.

Each property: no exception but the protocol's own (a clear close code and reason), no hang (the
profile's deadline, tests/conftest.py), nothing accepted that was not signed. The sessions run on the
gateway's Kafka-free core (OpenCalls over an Outbox nobody sends from).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.gateway.audiohook import AudioHookSession, State
from pipeline.gateway.auth import (
    AudioHookAuthenticator,
    audiohook_signed_headers,
    twilio_refusal,
    twilio_signature,
)
from pipeline.gateway.calls import OpenCalls
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.outbox import Outbox
from pipeline.gateway.protocol import ProtocolError
from pipeline.gateway.twilio import TwilioStream

from .conftest import AUDIOHOOK_KEY, AUDIOHOOK_SECRET, TWILIO_TOKEN, AudioHookClient, TwilioMessages

LEG_BUFFER_S = 2.0
MESSAGE_MS = 20

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
numberish = st.integers(-(2**64), 2**64).map(str) | st.integers(-(2**40), 2**40) | json_scalars
base64ish = st.binary(max_size=400).map(lambda b: base64.b64encode(b).decode()) | st.text(max_size=60)


def core() -> tuple[OpenCalls, Outbox, GatewayMetrics]:
    metrics = GatewayMetrics()
    outbox = Outbox(metrics, LEG_BUFFER_S, MESSAGE_MS)
    return OpenCalls(outbox, metrics, 0.3, message_ms=MESSAGE_MS), outbox, metrics


def fields(known: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with any subset of the known fields (each a plausible or a wild value), plus stray keys."""
    return st.fixed_dictionaries({}, optional={k: v | json_values for k, v in known.items()}).flatmap(
        lambda d: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(lambda extra: {**extra, **d}))


twilio_start = fields({
    "streamSid": st.text(max_size=40), "accountSid": st.text(max_size=40), "callSid": st.text(max_size=40),
    "tracks": st.lists(st.sampled_from(["inbound", "outbound", "both", ""]), max_size=3),
    "mediaFormat": fields({"encoding": st.sampled_from(["audio/x-mulaw", "audio/x-alaw", "audio/l16", ""]),
                           "sampleRate": st.sampled_from([8000, 16000, 0, -1]), "channels": st.integers(-1, 3)}),
    "customParameters": st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=3),
})
twilio_media = fields({"track": st.sampled_from(["inbound", "outbound", "both"]), "chunk": numberish,
                       "timestamp": numberish, "payload": base64ish})
twilio_message = fields({
    "event": st.sampled_from(["connected", "start", "media", "stop", "mark", "dtmf", "clear"]) | st.text(max_size=8),
    "sequenceNumber": numberish, "streamSid": st.text(max_size=40), "start": twilio_start, "media": twilio_media,
})


@given(st.lists(twilio_message.map(json.dumps) | st.text(max_size=200), min_size=1, max_size=12))
def test_twilio_messages_end_in_a_protocol_close_or_are_taken(messages: list[str]) -> None:
    calls, outbox, _ = core()
    stream = TwilioStream(calls, GatewayMetrics(), "s1")
    for text in messages:
        try:
            stream.on_text(text)
        except ProtocolError as err:  # the stream closes with its code; the gateway goes on
            assert 1000 <= err.code <= 4999 and err.detail
            break
    stream.close("fuzz")
    # Whatever came in, the audio held per leg stays within the leg buffer (a forged timestamp once
    # allocated hundreds of MB of filler).
    assert all(len(leg) <= outbox.leg_capacity for leg in outbox._legs.values())


# Deeper: a stream that opened as the platform opens it, then media whose fields are fuzzed one by one
# (timestamps far ahead or behind, chunk counters, tracks, payloads of any length).
@given(st.lists(st.tuples(st.sampled_from(["inbound", "outbound"]), st.integers(0, 5000), st.binary(max_size=400),
                          twilio_media), min_size=1, max_size=30))
def test_a_started_twilio_stream_takes_or_closes_on_any_media(media: list[tuple[str, int, bytes, dict[str, Any]]]) -> None:
    calls, outbox, _ = core()
    stream, script = TwilioStream(calls, GatewayMetrics(), "s1"), TwilioMessages("CA-fuzz")
    stream.on_text(script.start())
    try:
        for track, timestamp_ms, payload, overrides in media:
            message = json.loads(script.media(track, timestamp_ms, payload))
            message["media"].update(overrides)
            stream.on_text(json.dumps(message))
        stream.on_text(script.stop())
    except ProtocolError as err:
        assert 1000 <= err.code <= 4999 and err.detail
    stream.close("fuzz")
    assert all(len(leg) <= outbox.leg_capacity for leg in outbox._legs.values())


@given(st.lists(st.binary(max_size=1700) | st.tuples(st.sampled_from(["ping", "pause", "resume", "paused", "discarded",
                                                                        "update", "dtmf", "close"]), json_values),
                min_size=1, max_size=30))
def test_an_open_audiohook_session_answers_any_audio_and_message(steps: list[Any]) -> None:
    calls, outbox, _ = core()
    session, client = AudioHookSession(calls, GatewayMetrics(), "s1"), AudioHookClient()
    for reply in session.on_text(client.open()):
        client.saw(reply)
    assert session.state is State.ACTIVE
    for step in steps:
        if isinstance(step, bytes):
            replies = session.on_binary(step)
        else:
            kind, parameters = step
            replies = session.on_text(client.message(kind, parameters if isinstance(parameters, dict) else {"x": parameters}))
        for reply in replies:
            json.dumps(reply)
            client.saw(reply)
        if session.state is State.ERROR:
            assert session.error is not None and session.error.detail
    assert all(len(leg) <= outbox.leg_capacity for leg in outbox._legs.values())


audiohook_open = fields({
    "organizationId": st.uuids().map(str) | st.text(max_size=10), "conversationId": st.uuids().map(str),
    "participant": fields({"id": st.uuids().map(str), "ani": st.text(max_size=12), "dnis": st.text(max_size=12)}),
    "media": st.lists(fields({"type": st.just("audio"), "format": st.sampled_from(["PCMU", "L16", "opus"]),
                              "channels": st.lists(st.sampled_from(["external", "internal", "x"]), max_size=3),
                              "rate": st.sampled_from([8000, 16000, 0])}), max_size=3),
    "position": st.sampled_from(["PT0S", "PT1.5S", "P1D", "PT-1S", "x"]),
    "customConfig": json_values,
})
audiohook_message = fields({
    "version": st.sampled_from(["2", "1", ""]),
    "type": st.sampled_from(["open", "ping", "pause", "resume", "paused", "update", "close", "discarded",
                             "error", "dtmf", "event"]) | st.text(max_size=8),
    "seq": st.integers(-2, 20), "serverseq": st.integers(-2, 20), "id": st.uuids().map(str),
    "position": st.sampled_from(["PT0S", "PT2S", "PT99999999S", "bad"]),
    "parameters": audiohook_open | fields({"discarded": st.sampled_from(["PT1S", "PT86400S", "x"]),
                                           "reason": st.text(max_size=10)}),
})


@given(st.lists(audiohook_message.map(json.dumps) | st.text(max_size=200) | st.binary(max_size=3200),
                min_size=1, max_size=12))
def test_audiohook_messages_and_audio_get_answers_never_exceptions(messages: list[str | bytes]) -> None:
    calls, outbox, _ = core()
    session = AudioHookSession(calls, GatewayMetrics(), "s1")
    for message in messages:
        replies = session.on_binary(message) if isinstance(message, bytes) else session.on_text(message)
        assert isinstance(replies, list)
        for reply in replies:
            json.dumps(reply)  # every answer can be sent
        if session.state is State.ERROR:  # a clear disconnect: reason and info for the client
            assert session.error is not None and session.error.detail
    assert all(len(leg) <= outbox.leg_capacity for leg in outbox._legs.values())


# ---- handshake credentials ---------------------------------------------------------------------------------
TARGET, AUTHORITY = "/audiohook", "gw.example.com"
AUDIOHOOK_HEADERS = {"audiohook-organization-id": "d7934305-0972-4844-938e-9060eef73d05",
                     "audiohook-session-id": "e160e428-53e2-487c-977d-96989bf5c99d",
                     "audiohook-correlation-id": "30b0e395-84d3-4570-ac13-9a62d8f514c0"}
header_names = st.sampled_from(["signature", "signature-input", "x-api-key", "audiohook-organization-id",
                                "audiohook-session-id", "audiohook-correlation-id", "host"])


def authenticator() -> AudioHookAuthenticator:
    return AudioHookAuthenticator(AUDIOHOOK_KEY, AUDIOHOOK_SECRET, max_age_s=60, clock_skew_s=5)


def lowered(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


@given(st.dictionaries(header_names | st.text(max_size=12), st.text(max_size=120), max_size=8))
def test_audiohook_headers_nobody_signed_are_refused_with_a_reason(headers: dict[str, str]) -> None:
    refusal = authenticator().refusal(TARGET, AUTHORITY, {"x-api-key": AUDIOHOOK_KEY, **AUDIOHOOK_HEADERS, **headers})
    assert isinstance(refusal, str) and refusal


@given(header_names, st.integers(0, 200), st.characters(codec="ascii", exclude_characters="\r\n"))
def test_an_audiohook_signature_changed_anywhere_is_refused(name: str, at: int, char: str) -> None:
    signed = lowered(audiohook_signed_headers(AUTHORITY, TARGET, AUDIOHOOK_KEY, AUDIOHOOK_SECRET, AUDIOHOOK_HEADERS))
    assert authenticator().refusal(TARGET, AUTHORITY, signed) is None  # as signed: taken
    value = signed.get(name, "")
    if not value or value[at % len(value)] == char:
        return
    i = at % len(value)
    forged = {**signed, name: value[:i] + char + value[i + 1:]}
    assert authenticator().refusal(TARGET, AUTHORITY, forged) is not None, f"{name} changed at {i} was taken"


@given(st.text(max_size=80), st.text(max_size=60) | st.none())
def test_a_twilio_signature_is_taken_only_for_its_own_url(path: str, signature: str | None) -> None:
    url = f"wss://gw.example.com/twilio/{path}"
    assert twilio_refusal(TWILIO_TOKEN, url, twilio_signature(TWILIO_TOKEN, url)) is None
    if signature != twilio_signature(TWILIO_TOKEN, url):
        assert twilio_refusal(TWILIO_TOKEN, url, signature) in {"missing_signature", "bad_signature"}


def test_an_audiohook_signature_in_another_base64_spelling_of_the_same_bytes_is_refused() -> None:
    # Found by the fuzzer above in CI: the last base64 character of a 32-byte HMAC carries 2 unused bits,
    # so three other characters decode to the same signature; only the signer's own spelling is taken.
    import string

    signed = lowered(audiohook_signed_headers(AUTHORITY, TARGET, AUDIOHOOK_KEY, AUDIOHOOK_SECRET, AUDIOHOOK_HEADERS))
    value = signed["signature"]
    last = value.rindex("=:") - 1  # the last data character, before the padding
    taken = [c for c in string.ascii_letters + string.digits + "+/" if c != value[last] and authenticator().refusal(
        TARGET, AUTHORITY, {**signed, "signature": value[:last] + c + value[last + 1:]}) is None]
    assert taken == []
