"""SIP digest authentication: RFC 2617's and RFC 7616's worked examples, and our own server's checks."""

from __future__ import annotations

import contextlib
import hashlib
import random
import re

import pytest

from pipeline.gateway.siprec.digest import (
    DigestAuth,
    DigestError,
    DigestResult,
    authorization,
    parse_header,
    parse_users,
)
from tests.gateway.conftest import ManualClock

URI = "sip:srs@192.0.2.50:5060"


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_rfc_2617_worked_example() -> None:
    # RFC 2617 §3.5's values; the expected response is computed here from them, and matches the RFC's.
    ha1 = _md5("Mufasa:testrealm@host.com:Circle Of Life")
    ha2 = _md5("GET:/dir/index.html")
    expected = _md5(f"{ha1}:dcd98b7102dd2f0e8b11d0f600bfb0c093:00000001:0a4f113b:auth:{ha2}")
    assert expected == "6629fae49393a05397450978507c4ef1"
    challenge = ('Digest realm="testrealm@host.com", qop="auth,auth-int", '
                 'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"')
    header = authorization("GET", "/dir/index.html", "Mufasa", "Circle Of Life", challenge, cnonce="0a4f113b")
    scheme, params = parse_header(header)
    assert scheme == "digest"
    assert params == {"username": "Mufasa", "realm": "testrealm@host.com", "nonce": "dcd98b7102dd2f0e8b11d0f600bfb0c093",
                      "uri": "/dir/index.html", "response": expected, "algorithm": "MD5", "cnonce": "0a4f113b",
                      "qop": "auth", "nc": "00000001", "opaque": "5ccc069c403ebaf9f0171e9517f40e41"}


def test_rfc_7616_sha256_example() -> None:
    ha1 = _sha256("Mufasa:http-auth@example.org:Circle of Life")
    ha2 = _sha256("GET:/dir/index.html")
    nonce, cnonce = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
    expected = _sha256(f"{ha1}:{nonce}:00000001:{cnonce}:auth:{ha2}")
    assert expected == "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
    challenge = (f'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=SHA-256, nonce="{nonce}", '
                 'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"')
    header = authorization("GET", "/dir/index.html", "Mufasa", "Circle of Life", challenge, cnonce=cnonce)
    assert parse_header(header)[1]["response"] == expected
    assert parse_header(header)[1]["algorithm"] == "SHA-256"


def test_parse_users() -> None:
    assert parse_users("alice:s3cret, bob:pa:ss:word") == {"alice": "s3cret", "bob": "pa:ss:word"}
    assert parse_users("") == {}
    assert parse_users("  ") == {}
    for spec, position in [("alice:s3cret,hunter2secret", 2), ("alice:", 1), (":hunter2secret", 1),
                           ("alice:x,,bob:y", 2), ("alice:x,alice:hunter2secret", 2),
                           ('al"ice:hunter2secret', 1)]:
        with pytest.raises(DigestError, match=f"entry {position}") as caught:
            parse_users(spec)
        assert "hunter2secret" not in str(caught.value)


def test_challenge_shape() -> None:
    auth = DigestAuth({"src": "pw"}, realm="recorder.example.com", secret=b"k" * 32)
    challenge = auth.challenge()
    assert re.fullmatch(r'Digest realm="recorder\.example\.com", nonce="[0-9a-f-]+", algorithm=MD5, qop="auth"',
                        challenge)
    assert auth.challenge(stale=True).endswith(", stale=true")
    assert auth.challenge() != challenge  # salted: two challenges in the same second differ
    with pytest.raises(DigestError):
        DigestAuth({}, realm='bad"realm')


def test_round_trip_md5_and_sha256() -> None:
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    challenge = auth.challenge()
    header = authorization("INVITE", URI, "src", "s3cret", challenge)
    assert auth.check("INVITE", header) == DigestResult("src", None)
    again = authorization("INVITE", URI, "src", "s3cret", challenge, nc=2)  # the nonce reused, its count up
    assert auth.check("INVITE", again, request_uri=URI) == DigestResult("src", None)
    sha_challenge = auth.challenge().replace("algorithm=MD5", "algorithm=SHA-256")
    sha_header = authorization("INVITE", URI, "src", "s3cret", sha_challenge, nc=2)
    assert "algorithm=SHA-256" in sha_header and "nc=00000002" in sha_header
    assert auth.check("INVITE", sha_header) == DigestResult("src", None)


def test_rfc_2069_response_without_qop_is_accepted() -> None:
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    challenge = auth.challenge().replace(', qop="auth"', "")
    header = authorization("INVITE", URI, "src", "s3cret", challenge)
    assert "qop" not in header and "cnonce" not in header
    assert auth.check("INVITE", header) == DigestResult("src", None)


def test_refusals() -> None:
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    challenge = auth.challenge()
    good = authorization("INVITE", URI, "src", "s3cret", challenge)
    assert auth.check("INVITE", None) == DigestResult(None, "no_credentials")
    assert auth.check("INVITE", "  ") == DigestResult(None, "no_credentials")
    assert auth.check("INVITE", "Basic c3JjOnMzY3JldA==") == DigestResult(None, "no_credentials")
    assert auth.check("INVITE", authorization("INVITE", URI, "src", "wrong", challenge)).refusal == "bad_response"
    assert auth.check("BYE", good).refusal == "bad_response"  # computed for INVITE
    assert auth.check("INVITE", authorization("INVITE", URI, "eve", "s3cret", challenge)).refusal == "unknown_user"
    assert auth.check("INVITE", good, request_uri="sip:srs@elsewhere").refusal == "bad_uri"
    other_realm = challenge.replace('realm="callqa"', 'realm="other"')
    assert auth.check("INVITE", authorization("INVITE", URI, "src", "s3cret", other_realm)).refusal == "bad_realm"
    assert auth.check("INVITE", good.replace("qop=auth", "qop=auth-int")).refusal == "bad_qop"
    assert auth.check("INVITE", good.replace("algorithm=MD5", "algorithm=MD5-sess")).refusal == "bad_algorithm"
    assert auth.check("INVITE", re.sub(r", nc=\w+", "", good)).refusal == "malformed"
    assert auth.check("INVITE", re.sub(r', cnonce="\w+"', "", good)).refusal == "malformed"
    assert auth.check("INVITE", re.sub(r', response="\w+"', "", good)).refusal == "malformed"
    assert auth.check("INVITE", good[:-5] + ' "unclosed').refusal == "malformed"
    assert auth.check("INVITE", good + ', username="again"').refusal == "malformed"
    assert auth.check("INVITE", "Digest " + ", ".join(f"x{i}=y" for i in range(40))).refusal == "malformed"
    assert auth.check("INVITE", "Digest\t" + good[len("Digest "):]) == DigestResult("src", None)


def test_forged_nonces_are_refused() -> None:
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    stranger = DigestAuth({"src": "s3cret"}, secret=b"other secret")
    # A nonce of another server (another secret): well formed, but not ours.
    assert auth.check("INVITE", authorization("INVITE", URI, "src", "s3cret", stranger.challenge())) == (
        DigestResult(None, "bad_nonce"))
    nonce = re.search(r'nonce="([^"]+)"', auth.challenge())
    assert nonce is not None
    stamp, salt, mac = nonce.group(1).split("-")
    # Moving the timestamp forward (to live longer) breaks the HMAC.
    later = f"{int(stamp, 16) + 3600:x}-{salt}-{mac}"
    for forged in (later, "dcd98b7102dd2f0e8b11d0f600bfb0c093", "x" * 500):
        challenge = f'Digest realm="callqa", nonce="{forged}", qop="auth"'
        assert auth.check("INVITE", authorization("INVITE", URI, "src", "s3cret", challenge)).refusal == "bad_nonce"


def test_expired_nonce_is_stale_only_with_the_right_password() -> None:
    clock = ManualClock()
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32, nonce_ttl_s=300.0, clock=clock)
    challenge = auth.challenge()
    right = authorization("INVITE", URI, "src", "s3cret", challenge)
    wrong = authorization("INVITE", URI, "src", "guess", challenge)
    clock.advance(299.0)
    assert auth.check("INVITE", right) == DigestResult("src", None)
    clock.advance(2.0)
    assert auth.check("INVITE", right) == DigestResult(None, "stale_nonce", stale=True)
    assert auth.check("INVITE", wrong) == DigestResult(None, "bad_response", stale=False)
    fresh = authorization("INVITE", URI, "src", "s3cret", auth.challenge(stale=True))
    assert auth.check("INVITE", fresh) == DigestResult("src", None)


def test_header_parsing() -> None:
    value = 'digest USERNAME="a \\"quoted\\", name", Realm=callqa ,, NONCE="x,y" ,qop=auth,  nc=00000001'
    assert parse_header(value) == ("digest", {"username": 'a "quoted", name', "realm": "callqa", "nonce": "x,y",
                                              "qop": "auth", "nc": "00000001"})
    assert parse_header("Digest") == ("digest", {})
    for bad in ["", "Digest realm", "Digest realm=", 'Digest realm="x" nonce="y"', 'Digest realm="x',
                "Digest =x", "Digest a=1, a=2", "Digest a=" + "x" * 5000]:
        with pytest.raises(DigestError):
            parse_header(bad)


def test_usernames_with_quotes_round_trip() -> None:
    auth = DigestAuth({'odd"user\\name': "pw,with,commas"}, secret=b"k" * 32)
    header = authorization("INVITE", URI, 'odd"user\\name', "pw,with,commas", auth.challenge())
    assert auth.check("INVITE", header) == DigestResult('odd"user\\name', None)


def test_client_refuses_challenges_it_cannot_answer() -> None:
    for challenge in ['Basic realm="x"', 'Digest nonce="n"', 'Digest realm="x", nonce="n", algorithm=SHA-512',
                      'Digest realm="x", nonce="n", qop="auth-int"', 'Digest realm="x", nonce="n']:
        with pytest.raises(DigestError):
            authorization("INVITE", URI, "src", "pw", challenge)


def test_fuzzed_headers_never_raise_from_check() -> None:
    rng = random.Random(2617)
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    challenge = auth.challenge()
    good = authorization("INVITE", URI, "src", "s3cret", challenge)
    accepted = 0
    for _ in range(3000):
        chars = list(rng.choice([good, challenge]))
        if rng.random() < 0.3:
            chars = chars[: rng.randrange(len(chars) + 1)]
        for _ in range(rng.randrange(5)):
            if chars:
                chars[rng.randrange(len(chars))] = rng.choice('",=\\ \tabcZ0\x00\u00e9')
        text = "".join(chars)
        result = auth.check("INVITE", text)
        assert isinstance(result, DigestResult)
        assert (result.user is None) != (result.refusal is None)
        accepted += result.user is not None
        with contextlib.suppress(DigestError):
            authorization("INVITE", URI, "src", "s3cret", text)
    assert accepted > 0


def test_a_replayed_answer_is_refused_and_a_nonce_not_issued_here_is_stale() -> None:
    """A captured Authorization sent again (its nonce count not risen) is refused; so is an RFC 2069 answer
    (no qop, no count) used twice. A nonce that passes the HMAC but was not issued by this server (another
    process with the same secret, or one forgotten) is answered stale, never taken."""
    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    challenge = auth.challenge()
    header = authorization("INVITE", URI, "src", "s3cret", challenge, nc=3)
    assert auth.check("INVITE", header) == DigestResult("src", None)
    assert auth.check("INVITE", header) == DigestResult(None, "replayed_nonce")
    lower = authorization("INVITE", URI, "src", "s3cret", challenge, nc=2)
    assert auth.check("INVITE", lower) == DigestResult(None, "replayed_nonce")
    plain = auth.challenge().replace(', qop="auth"', "")
    once = authorization("INVITE", URI, "src", "s3cret", plain)
    assert auth.check("INVITE", once) == DigestResult("src", None)
    assert auth.check("INVITE", once) == DigestResult(None, "replayed_nonce")
    twin = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)  # the same secret, its own challenges
    elsewhere = authorization("INVITE", URI, "src", "s3cret", twin.challenge())
    assert auth.check("INVITE", elsewhere) == DigestResult(None, "stale_nonce", stale=True)


def test_issued_nonces_are_bounded() -> None:
    from pipeline.gateway.siprec.digest import MAX_ISSUED_NONCES

    auth = DigestAuth({"src": "s3cret"}, secret=b"k" * 32)
    first = auth.challenge()
    for _ in range(MAX_ISSUED_NONCES):
        auth.challenge()
    assert len(auth._issued) == MAX_ISSUED_NONCES
    forgotten = authorization("INVITE", URI, "src", "s3cret", first)
    assert auth.check("INVITE", forgotten) == DigestResult(None, "stale_nonce", stale=True)


def test_the_uri_must_name_the_request_uri_s_target() -> None:
    """SIPp answers a challenge for sip:srs@host:port with uri="sip:host:port": the same server, taken;
    credentials computed for another host or port are not."""
    from pipeline.gateway.siprec.digest import same_target

    assert same_target("sip:127.0.0.1:5070", "sip:srs@127.0.0.1:5070")
    assert same_target("sip:srs@pbx.example", "sip:srs@PBX.example:5060;transport=tcp")
    assert same_target("sip:[::1]:5070", "sip:srs@[::1]:5070")
    assert not same_target("sip:127.0.0.1:5071", "sip:srs@127.0.0.1:5070")
    assert not same_target("sips:srs@pbx.example", "sip:srs@pbx.example")
    assert not same_target("sip:srs@elsewhere", "sip:srs@pbx.example")
    assert not same_target("garbage", "sip:srs@pbx.example")
