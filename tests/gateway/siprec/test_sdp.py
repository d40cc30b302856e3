"""SDP offers as SBCs write them (RFC 4566), and the answers we write back (RFC 3264)."""

from __future__ import annotations

import random
import re

import pytest

from pipeline.gateway.siprec.sdp import (
    MAX_ATTRIBUTES,
    MAX_MEDIA,
    MAX_SDP_BYTES,
    Crypto,
    MediaAnswer,
    OfferStream,
    SdpError,
    SdpOffer,
    build_answer,
    build_offer,
    parse_sdp,
)
from tests.gateway.siprec.examples import INVITE_SDP

KEY = "inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVzcyAoc2VuZGVyIH49|2^20|1:32"
HEADER = "v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\ns=-\r\nt=0 0\r\n"


def test_siprec_offer_gives_two_labelled_sendonly_streams() -> None:
    offer = parse_sdp(INVITE_SDP)
    assert (offer.origin_user, offer.session_id, offer.session_version) == ("SBC-SRC", "2890844526", "2890844526")
    assert offer.connection == "198.51.100.20"
    assert [m.label for m in offer.media] == ["1", "2"]
    assert [m.port for m in offer.media] == [49170, 49172]
    for index, m in enumerate(offer.media):
        assert m.index == index
        assert (m.media, m.proto, m.formats) == ("audio", "RTP/AVP", (0, 8, 101))
        assert m.rtpmap == {0: ("pcmu", 8000), 8: ("pcma", 8000), 101: ("telephone-event", 8000)}
        assert m.direction == "sendonly"
        assert m.connection == "198.51.100.20"
        assert m.ptime == 20
        assert m.crypto == ()
        assert m.payload_type("telephone-event") == 101
        assert m.payload_type("PCMA") == 8
        assert m.payload_type("opus") is None


def test_lf_line_ends_and_bytes_read_the_same() -> None:
    assert parse_sdp(INVITE_SDP.replace("\r\n", "\n")) == parse_sdp(INVITE_SDP)
    assert parse_sdp(INVITE_SDP.encode()) == parse_sdp(INVITE_SDP)
    assert parse_sdp(INVITE_SDP + "\r\n\r\n") == parse_sdp(INVITE_SDP)


def test_static_payload_types_without_rtpmap_and_dynamic_ones_with_it() -> None:
    offer = parse_sdp(HEADER + "m=audio 4000 RTP/AVP 0 8 9 13 96 97\r\n"
                      "a=rtpmap:96 opus/48000/2\r\na=rtpmap:97 Telephone-Event/48000\r\n"
                      "a=rtpmap:120 unused/8000\r\n")
    m = offer.media[0]
    assert m.rtpmap == {0: ("pcmu", 8000), 8: ("pcma", 8000), 9: ("g722", 8000), 13: ("cn", 8000),
                        96: ("opus", 48000), 97: ("telephone-event", 48000)}
    assert m.payload_type("telephone-event") == 97
    # A dynamic payload type with no rtpmap stays unnamed rather than guessed.
    assert parse_sdp(HEADER + "m=audio 4000 RTP/AVP 96\r\n").media[0].rtpmap == {}


def test_direction_and_connection_inherit_from_the_session_level() -> None:
    text = (HEADER + "c=IN IP4 192.0.2.9\r\na=inactive\r\n"
            "m=audio 4000 RTP/AVP 0\r\n"
            "m=audio 4002 RTP/AVP 0\r\nc=IN IP6 2001:db8::7\r\na=sendonly\r\n")
    first, second = parse_sdp(text).media
    assert (first.direction, first.connection) == ("inactive", "192.0.2.9")
    assert (second.direction, second.connection) == ("sendonly", "2001:db8::7")
    no_session_attrs = parse_sdp(HEADER + "m=audio 4000 RTP/AVP 0\r\n").media[0]
    assert (no_session_attrs.direction, no_session_attrs.connection, no_session_attrs.label) == ("sendrecv", None, None)


def test_multicast_ttl_port_count_and_disabled_streams() -> None:
    offer = parse_sdp(HEADER + "c=IN IP4 233.252.0.1/127\r\nm=audio 5000/2 RTP/AVP 0\r\nm=video 0 RTP/AVP 31\r\n")
    assert offer.connection == "233.252.0.1"
    assert [(m.media, m.port) for m in offer.media] == [("audio", 5000), ("video", 0)]


def test_sdes_crypto_lines() -> None:
    offer = parse_sdp(HEADER + "m=audio 4000 RTP/SAVP 0\r\n"
                      f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 {KEY}\r\n"
                      f"a=crypto:2 AES_CM_128_HMAC_SHA1_32 {KEY} KDR=0\r\n")
    m = offer.media[0]
    assert m.proto == "RTP/SAVP"
    assert m.crypto == (Crypto(1, "AES_CM_128_HMAC_SHA1_80", KEY), Crypto(2, "AES_CM_128_HMAC_SHA1_32", KEY))


def test_non_rtp_streams_may_name_formats_freely() -> None:
    m = parse_sdp(HEADER + "m=application 0 TCP/BFCP *\r\nm=audio 4000 RTP/AVP 0\r\n").media[0]
    assert (m.media, m.port, m.formats, m.format_tokens) == ("application", 0, (), ("*",))


@pytest.mark.parametrize(("text", "says"), [
    ("o=- 1 1 IN IP4 192.0.2.1\r\nv=0\r\ns=-\r\n", "line 1: must start with v=0"),
    ("", "must start with v=0"),
    ("v=1\r\no=- 1 1 IN IP4 192.0.2.1\r\ns=-\r\n", "must start with v=0"),
    ("v=0\r\ns=-\r\nt=0 0\r\n", "no o= line"),
    ("v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\nt=0 0\r\n", "no s= line"),
    ("v=0\r\no=- 1 1 IN IP4\r\ns=-\r\n", "line 2: o= needs 6 fields"),
    (HEADER + "X=foo\r\n", "line 5: expected '<letter>=<value>'"),
    (HEADER + "just words\r\n", "line 5"),
    (HEADER + "c=IN IP4\r\n", "line 5: c="),
    (HEADER + "m=audio 4000 RTP/AVP\r\n", "line 5: m= needs"),
    (HEADER + "m=audio x RTP/AVP 0\r\n", "line 5: m= needs a port, got 'x'"),
    (HEADER + "m=audio 70000 RTP/AVP 0\r\n", "line 5: m= needs a port"),
    (HEADER + "m=audio 4000 RTP/AVP 0 PCMU\r\n", "line 5: RTP payload type must be 0-127, got 'PCMU'"),
    (HEADER + "m=audio 4000 RTP/AVP 200\r\n", "line 5: RTP payload type"),
    (HEADER + "m=audio 4000 RTP/AVP 96\r\na=rtpmap:96 opus\r\n", "line 6: rtpmap"),
    (HEADER + "m=audio 4000 RTP/AVP 96\r\na=rtpmap:96 opus/fast\r\n", "line 6: rtpmap"),
    (HEADER + "m=audio 4000 RTP/SAVP 0\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80\r\n", "line 6: crypto"),
    (HEADER + "m=audio 4000 RTP/SAVP 0\r\na=crypto:x AES_CM_128_HMAC_SHA1_80 inline:k\r\n", "line 6: crypto tag"),
    (HEADER + "m=audio 4000 RTP/AVP 0\r\na=ptime:soon\r\n", "line 6: ptime"),
    (HEADER + "m=audio 4000 RTP/AVP 0\r\no=- 1 1 IN IP4 192.0.2.1\r\n", "line 6: o= belongs before"),
    (HEADER + "v=0\r\n", "line 5: a second v= line"),
    (HEADER + "m=audio 4000 RTP/AVP 0\r\na=label:1\ra=inject\r\n", "line 6: holds a CR or NUL"),
])
def test_malformed_offers_name_the_line(text: str, says: str) -> None:
    with pytest.raises(SdpError, match=re.escape(says)):
        parse_sdp(text)


def test_bounds() -> None:
    with pytest.raises(SdpError, match=f"more than {MAX_SDP_BYTES}"):
        parse_sdp(HEADER + "a=x\r\n" * (MAX_SDP_BYTES // 5))
    with pytest.raises(SdpError, match=f"more than {MAX_SDP_BYTES}"):
        parse_sdp((HEADER + "a=" + "x" * MAX_SDP_BYTES).encode())
    many_media = HEADER + "m=audio 4000 RTP/AVP 0\r\n" * (MAX_MEDIA + 1)
    with pytest.raises(SdpError, match=f"line {5 + MAX_MEDIA}: more than {MAX_MEDIA} m= lines"):
        parse_sdp(many_media)
    assert len(parse_sdp(HEADER + "m=audio 4000 RTP/AVP 0\r\n" * MAX_MEDIA).media) == MAX_MEDIA
    many_attributes = HEADER + "m=audio 4000 RTP/AVP 0\r\n" + "a=x-vendor:1\r\n" * (MAX_ATTRIBUTES + 1)
    with pytest.raises(SdpError, match=f"more than {MAX_ATTRIBUTES} attributes"):
        parse_sdp(many_attributes)


def test_answer_to_the_siprec_offer() -> None:
    offer = parse_sdp(INVITE_SDP)
    answer = build_answer(offer, [MediaAnswer(30000, (0, 101), "recvonly"), MediaAnswer(30002, (8, 101), "recvonly")],
                          "192.0.2.50", session_id=77, version=2)
    assert answer == (
        "v=0\r\n"
        "o=callqa 77 2 IN IP4 192.0.2.50\r\n"
        "s=callqa\r\n"
        "c=IN IP4 192.0.2.50\r\n"
        "t=0 0\r\n"
        "m=audio 30000 RTP/AVP 0 101\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\n"
        "a=fmtp:101 0-15\r\n"
        "a=label:1\r\n"
        "a=recvonly\r\n"
        "m=audio 30002 RTP/AVP 8 101\r\n"
        "a=rtpmap:8 PCMA/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\n"
        "a=fmtp:101 0-15\r\n"
        "a=label:2\r\n"
        "a=recvonly\r\n"
    )
    # What we write is itself SDP our own parser (and so a peer's) reads back.
    reread = parse_sdp(answer)
    assert [(m.port, m.formats, m.direction, m.label) for m in reread.media] == [
        (30000, (0, 101), "recvonly", "1"), (30002, (8, 101), "recvonly", "2")]


def test_refused_and_disabled_streams_answer_port_zero_with_one_format() -> None:
    offer = parse_sdp(HEADER + "m=audio 4000 RTP/AVP 8 0\r\na=label:a\r\nm=video 5000 RTP/AVP 31 34\r\n"
                      "m=audio 0 RTP/AVP 0\r\nm=application 6000 TCP/BFCP *\r\n")
    answer = build_answer(offer, [MediaAnswer(30000, (8,), "inactive"), MediaAnswer(0, (31,), "inactive"),
                                  MediaAnswer(30004, (0,), "recvonly"), MediaAnswer(0, (), "inactive")],
                          "192.0.2.50", 1, 1)
    media_lines = [line for line in answer.split("\r\n") if line.startswith("m=")]
    assert media_lines == ["m=audio 30000 RTP/AVP 8", "m=video 0 RTP/AVP 31", "m=audio 0 RTP/AVP 0",
                           "m=application 0 TCP/BFCP *"]
    assert "a=inactive" in answer.split("\r\n")
    assert "a=label:a" in answer.split("\r\n")


def test_answer_over_ipv6_with_crypto() -> None:
    offer = parse_sdp(HEADER + f"m=audio 4000 RTP/SAVP 0\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 {KEY}\r\n")
    ours = Crypto(1, "AES_CM_128_HMAC_SHA1_80", "inline:b3Vycy1vd24ta2V5LWZvci10aGUtYW5zd2VyLS0tLS0=")
    answer = build_answer(offer, [MediaAnswer(30000, (0,), "recvonly", ours)], "2001:db8::50", 5, 6)
    lines = answer.split("\r\n")
    assert "o=callqa 5 6 IN IP6 2001:db8::50" in lines
    assert "c=IN IP6 2001:db8::50" in lines
    assert "m=audio 30000 RTP/SAVP 0" in lines
    assert f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 {ours.key_params}" in lines
    assert parse_sdp(answer).media[0].crypto == (ours,)


def test_answers_that_break_rfc_3264_are_refused() -> None:
    offer = parse_sdp(INVITE_SDP)
    with pytest.raises(SdpError, match="1 answers for 2 offered"):
        build_answer(offer, [MediaAnswer(30000, (0,), "recvonly")], "192.0.2.50", 1, 1)
    with pytest.raises(SdpError, match="subset"):
        build_answer(offer, [MediaAnswer(30000, (9,), "recvonly"), MediaAnswer(0, (0,), "inactive")],
                     "192.0.2.50", 1, 1)
    with pytest.raises(SdpError, match="direction"):
        build_answer(offer, [MediaAnswer(30000, (0,), "listen"), MediaAnswer(0, (0,), "inactive")],
                     "192.0.2.50", 1, 1)
    with pytest.raises(SdpError, match="address"):
        build_answer(offer, [MediaAnswer(0, (0,), "inactive")] * 2, "", 1, 1)


def test_offer_round_trip_as_the_client_writes_it() -> None:
    rtpmap = {0: ("pcmu", 8000), 101: ("telephone-event", 8000)}
    text = build_offer("192.0.2.7", [(40000, "1", (0, 101), rtpmap, "sendonly"),
                                     OfferStream(40002, "2", (8, 101), {101: ("telephone-event", 8000)}, ptime=20)],
                       session_id=9, version=3)
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    offer = parse_sdp(text)
    assert offer.session_id == "9" and offer.session_version == "3" and offer.connection == "192.0.2.7"
    first, second = offer.media
    assert (first.port, first.label, first.formats, first.direction, first.proto) == (
        40000, "1", (0, 101), "sendonly", "RTP/AVP")
    assert second.rtpmap == {8: ("pcma", 8000), 101: ("telephone-event", 8000)}
    assert second.ptime == 20
    assert "a=fmtp:101 0-15" in text.split("\r\n")


def test_offer_with_crypto_is_savp() -> None:
    crypto = Crypto(1, "AES_CM_128_HMAC_SHA1_80", KEY)
    offer = parse_sdp(build_offer("192.0.2.7", [OfferStream(40000, "1", (0,), crypto=crypto)]))
    assert offer.media[0].proto == "RTP/SAVP"
    assert offer.media[0].crypto == (crypto,)
    with pytest.raises(SdpError):
        build_offer("192.0.2.7", [])
    with pytest.raises(SdpError):
        build_offer("192.0.2.7", [OfferStream(0, "1", (0,))])


def _mutations(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    choice = rng.randrange(6)
    if choice == 0:
        return bytes(data[: rng.randrange(len(data) + 1)])
    if choice == 1:
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    lines = bytes(data).split(b"\r\n")
    if choice == 2:
        del lines[rng.randrange(len(lines))]
    elif choice == 3:
        lines.insert(rng.randrange(len(lines)), rng.choice(lines))
    elif choice == 4:
        index = rng.randrange(len(lines))
        lines[index] = lines[index][: rng.randrange(len(lines[index]) + 1)]
    else:
        lines.insert(rng.randrange(len(lines)), bytes(rng.randrange(256) for _ in range(rng.randrange(12))))
    return b"\r\n".join(lines)


def test_fuzzed_offers_raise_only_sdp_error() -> None:
    rng = random.Random(7866)
    seeds = [INVITE_SDP.encode(), (HEADER + f"m=audio 4000 RTP/SAVP 0 96\r\na=rtpmap:96 opus/48000/2\r\n"
                                   f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 {KEY}\r\na=ptime:20\r\n").encode()]
    parsed = 0
    for _ in range(3000):
        data = _mutations(rng, rng.choice(seeds))
        try:
            offer = parse_sdp(data if rng.random() < 0.5 else data.decode("utf-8", errors="replace"))
        except SdpError:
            continue
        assert isinstance(offer, SdpOffer)
        parsed += 1
    assert parsed > 100  # the mutations are not all fatal: the parser's success path is exercised too
