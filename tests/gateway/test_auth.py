"""Handshake credentials: Twilio's URL signature and Genesys AudioHook's API key plus RFC 9421 signature."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import uuid
from dataclasses import dataclass

import pytest
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

from pipeline.gateway.auth import AudioHookAuthenticator, NonceCache, PublicAddress, twilio_refusal

TOKEN = "12345678901234567890123456789012"


def twilio_sign(url: str, token: str = TOKEN) -> str:
    """Computed here independently of the gateway: base64 HMAC-SHA1 of the URL under the auth token."""
    return base64.b64encode(hmac.new(token.encode(), url.encode(), hashlib.sha1).digest()).decode()


def test_twilio_signature_of_the_public_url_is_accepted() -> None:
    url = "wss://gw.example.com/twilio"
    assert twilio_refusal(TOKEN, url, twilio_sign(url)) is None
    assert twilio_refusal(TOKEN, url, twilio_sign("wss://gw.example.com:443/twilio")) is None  # port variants
    assert twilio_refusal(TOKEN, url, twilio_sign(url, token="another-token")) == "bad_signature"
    assert twilio_refusal(TOKEN, url, twilio_sign("wss://gw.example.com/twilio?x=1")) == "bad_signature"
    assert twilio_refusal(TOKEN, url, None) == "missing_signature"


def test_the_public_url_comes_from_the_setting_or_the_proxy_headers() -> None:
    forwarded = {"host": "10.0.0.5:8765", "x-forwarded-proto": "https", "x-forwarded-host": "gw.example.com"}
    assert PublicAddress.of_request(forwarded, "", tls=False).url("/twilio") == "wss://gw.example.com/twilio"
    assert PublicAddress.of_request({"host": "127.0.0.1:8765"}, "", tls=False).url("/twilio") == \
        "ws://127.0.0.1:8765/twilio"
    assert PublicAddress.of_request(forwarded, "https://calls.example.com/gw/", tls=False).url("/twilio") == \
        "wss://calls.example.com/gw/twilio"


# ---- AudioHook --------------------------------------------------------------------------------------------
# Genesys's documented example (AudioHook protocol docs; also the reference implementation's test).
KAT_SECRET = "TXlTdXBlclNlY3JldEtleVRlbGxOby0xITJAMyM0JDU="
KAT_HEADERS = {
    "host": "audiohook.example.com",
    "audiohook-organization-id": "d7934305-0972-4844-938e-9060eef73d05",
    "audiohook-session-id": "30b0e395-84d3-4570-ac13-9a62d8f514c0",
    "audiohook-correlation-id": "e160e428-53e2-487c-977d-96989bf5c99d",
    "x-api-key": "SGVsbG8sIEkgYW0gdGhlIEFQSSBrZXkh",
    "signature": "sig1=:NZBwyBHRRyRoeLqy1IzOa9VYBuI8TgMFt2GRDkDuJh4=:",
    "signature-input": 'sig1=("@request-target" "@authority" "audiohook-organization-id" "audiohook-session-id" '
                       '"audiohook-correlation-id" "x-api-key");keyid="SGVsbG8sIEkgYW0gdGhlIEFQSSBrZXkh";'
                       'nonce="VGhpc0lzQVVuaXF1ZU5vbmNl";alg="hmac-sha256";created=1641013200;expires=3282026430',
}
KAT_TARGET = "/api/v1/voicebiometrics/ws"


def test_genesys_documented_signature_verifies() -> None:
    auth = AudioHookAuthenticator(KAT_HEADERS["x-api-key"], KAT_SECRET, max_age_s=0, clock_skew_s=3)
    assert auth.verify(KAT_TARGET, "audiohook.example.com", KAT_HEADERS, KAT_HEADERS["x-api-key"]) == \
        "VGhpc0lzQVVuaXF1ZU5vbmNl"
    assert auth.refusal(KAT_TARGET, "audiohook.example.com", KAT_HEADERS) is None
    # the same request anywhere else, or under another secret, does not
    assert auth.refusal(KAT_TARGET, "audiohook.example.com", KAT_HEADERS) == "replayed_nonce"
    other = AudioHookAuthenticator(KAT_HEADERS["x-api-key"], base64.b64encode(b"x" * 32).decode(), 0, 3)
    assert other.refusal(KAT_TARGET, "audiohook.example.com", KAT_HEADERS) == "bad_signature"
    moved = AudioHookAuthenticator(KAT_HEADERS["x-api-key"], KAT_SECRET, 0, 3)
    assert moved.refusal("/elsewhere", "audiohook.example.com", KAT_HEADERS) == "bad_signature"


@dataclass
class _Request:
    method: str
    url: str
    headers: dict[str, str]


API_KEY = "callqa-test-api-key"
SECRET = base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def signed_headers(*, key: str = API_KEY, secret: str = SECRET, nonce: str | None = None,
                   created: datetime.datetime | None = None) -> dict[str, str]:
    """An AudioHook upgrade request's headers, signed as Genesys signs them."""
    headers = {"host": "127.0.0.1:8765", "x-api-key": key, "audiohook-organization-id": str(uuid.uuid4()),
               "audiohook-session-id": str(uuid.uuid4()), "audiohook-correlation-id": str(uuid.uuid4())}
    request = _Request("GET", "https://127.0.0.1:8765/audiohook", headers)
    signer = HTTPMessageSigner(signature_algorithm=algorithms.HMAC_SHA256,
                               key_resolver=MappingKeyResolver(public_keys={}, private_keys={key: base64.b64decode(secret)}))
    signer.sign(request, key_id=key, label="sig1", nonce=nonce or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode(),
                created=created, covered_component_ids=("@request-target", "@authority", "audiohook-organization-id",
                                                        "audiohook-session-id", "audiohook-correlation-id", "x-api-key"))
    return {k.lower(): v for k, v in headers.items()}


@pytest.fixture
def auth() -> AudioHookAuthenticator:
    return AudioHookAuthenticator(API_KEY, SECRET, max_age_s=10, clock_skew_s=3)


def test_a_fresh_signature_is_accepted_once(auth: AudioHookAuthenticator) -> None:
    headers = signed_headers()
    assert auth.refusal("/audiohook", "127.0.0.1:8765", headers) is None
    assert auth.refusal("/audiohook", "127.0.0.1:8765", headers) == "replayed_nonce"


@pytest.mark.parametrize(("headers", "reason"), [
    (lambda: signed_headers(key="another-key"), "bad_api_key"),
    (lambda: {**signed_headers(), "x-api-key": ""}, "missing_api_key"),
    (lambda: signed_headers(created=datetime.datetime.now() - datetime.timedelta(seconds=60)), "stale_signature"),
    (lambda: signed_headers(created=datetime.datetime.now() + datetime.timedelta(seconds=60)), "stale_signature"),
    (lambda: signed_headers(nonce="short"), "short_nonce"),
    (lambda: signed_headers(secret=base64.b64encode(b"y" * 32).decode()), "bad_signature"),
    (lambda: {**signed_headers(), "audiohook-session-id": str(uuid.uuid4())}, "bad_signature"),
    (lambda: {k: v for k, v in signed_headers().items() if k != "signature"}, "bad_signature"),
    (lambda: {k: v for k, v in signed_headers().items() if k != "audiohook-organization-id"}, "missing_headers"),
])
def test_bad_credentials_are_refused_with_their_reason(auth: AudioHookAuthenticator, headers, reason) -> None:  # type: ignore[no-untyped-def]
    assert auth.refusal("/audiohook", "127.0.0.1:8765", headers()) == reason


def test_a_signature_for_another_host_is_refused(auth: AudioHookAuthenticator) -> None:
    assert auth.refusal("/audiohook", "evil.example.com", signed_headers()) == "bad_signature"


def test_nonces_expire_with_the_age_window() -> None:
    now = [0.0]
    cache = NonceCache(ttl_s=16, clock=lambda: now[0])
    assert cache.first_use("n1") and not cache.first_use("n1")
    now[0] = 17
    assert cache.first_use("n1")
