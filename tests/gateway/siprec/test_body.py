"""multipart/mixed SIP bodies (RFC 2046): the SIPREC INVITE's SDP and metadata parts."""

from __future__ import annotations

import random

import pytest

from pipeline.gateway.siprec.body import (
    MAX_BODY_BYTES,
    MAX_PARTS,
    BodyError,
    BodyPart,
    body_parts,
    multipart,
    parse_content_type,
)
from tests.gateway.siprec.examples import INVITE_BODY, INVITE_CONTENT_TYPE, INVITE_SDP, METADATA_XML


def test_siprec_invite_body_splits_into_sdp_and_metadata() -> None:
    parts = body_parts(INVITE_CONTENT_TYPE, INVITE_BODY)
    assert parts == [BodyPart("application/sdp", "", INVITE_SDP.encode()),
                     BodyPart("application/rs-metadata+xml", "recording-session", METADATA_XML.encode())]


def test_single_type_body_is_one_part() -> None:
    assert body_parts("Application/SDP; charset=utf-8", b"v=0\r\n") == [BodyPart("application/sdp", "", b"v=0\r\n")]


def test_quoted_boundary_preamble_epilogue_and_header_case() -> None:
    body = (b"This is the preamble.\r\n"
            b"--a:b (c)=?\r\n"
            b"CONTENT-TYPE: Application/SDP;charset=utf-8\r\n"
            b"content-disposition: Session ; handling=required\r\n"
            b"\r\n"
            b"v=0\r\n"
            b"--a:b (c)=?\t \r\n"  # transport padding after a delimiter
            b"\r\n"
            b"no headers at all\r\n"
            b"--a:b (c)=?--\r\n"
            b"epilogue, ignored\r\n")
    parts = body_parts('multipart/mixed; Boundary="a:b (c)=?"; other=x', body)
    assert parts == [BodyPart("application/sdp", "session", b"v=0"),
                     BodyPart("text/plain", "", b"no headers at all")]


def test_content_type_parameters_with_quotes_and_escapes() -> None:
    assert parse_content_type('Multipart/Mixed ; a="q\\"uote;d, yes" ;B=tok') == (
        "multipart/mixed", {"a": 'q"uote;d, yes', "b": "tok"})


def test_bare_lf_bodies_and_folded_part_headers() -> None:
    body = (b"--xyz\nContent-Type:\n application/rs-metadata+xml\nContent-Disposition: recording-session\n\n"
            b"<recording/>\n--xyz--")
    assert body_parts("multipart/mixed;boundary=xyz", body) == [
        BodyPart("application/rs-metadata+xml", "recording-session", b"<recording/>")]


def test_boundary_lookalikes_inside_a_part_are_content() -> None:
    body = b"--b1\r\nContent-Type: text/plain\r\n\r\nline\r\n--b1x is not it\r\n x--b1\r\n--b1--\r\n"
    assert body_parts("multipart/mixed;boundary=b1", body)[0].body == b"line\r\n--b1x is not it\r\n x--b1"


@pytest.mark.parametrize(("content_type", "body", "says"), [
    ("multipart/mixed", b"--x\r\n\r\nbody\r\n--x--", "without a boundary"),
    ('multipart/mixed;boundary=""', b"", "boundary"),
    ("multipart/mixed;boundary=" + "b" * 71, b"", "boundary"),
    ('multipart/mixed;boundary="unclosed', b"", "unclosed quote"),
    ("multipart/alternative;boundary=x", b"--x\r\n\r\nbody\r\n--x--", "only multipart/mixed"),
    ("not a type", b"", "not type/subtype"),
    ("multipart/mixed;boundary=x", b"no delimiter here", "never appears"),
    ("multipart/mixed;boundary=x", b"--x\r\nContent-Type: text/plain\r\n\r\nbody", "no closing delimiter"),
    ("multipart/mixed;boundary=x", b"--x--\r\n", "no parts"),
    ("multipart/mixed;boundary=x", b"--x\r\nContent-Type: text/plain\r\n--x--", "no blank line"),
    ("multipart/mixed;boundary=x", b"--x\r\nnot a header\r\n\r\nbody\r\n--x--", "part 1: header line"),
    ("multipart/mixed;boundary=x", b"--x\r\n\r\na\r\n--x\r\nContent-Type: multipart/mixed;boundary=y\r\n\r\n"
     b"--y\r\n\r\nb\r\n--y--\r\n--x--", "part 2: nested multipart/mixed is refused"),
    ("multipart/mixed;boundary=x", b"--x\r\nContent-Type: ???\r\n\r\nb\r\n--x--", "part 1"),
])
def test_malformed_bodies(content_type: str, body: bytes, says: str) -> None:
    with pytest.raises(BodyError, match=says):
        body_parts(content_type, body)


def test_bounds() -> None:
    too_many = b"".join(b"--x\r\n\r\npart\r\n" for _ in range(MAX_PARTS + 1)) + b"--x--\r\n"
    with pytest.raises(BodyError, match=f"more than {MAX_PARTS} parts"):
        body_parts("multipart/mixed;boundary=x", too_many)
    enough = b"".join(b"--x\r\n\r\npart\r\n" for _ in range(MAX_PARTS)) + b"--x--\r\n"
    assert len(body_parts("multipart/mixed;boundary=x", enough)) == MAX_PARTS
    with pytest.raises(BodyError, match="bytes, more than"):
        body_parts("application/sdp", b"x" * (MAX_BODY_BYTES + 1))
    many_headers = b"--x\r\n" + b"X-A: 1\r\n" * 40 + b"\r\nbody\r\n--x--"
    with pytest.raises(BodyError, match="header lines"):
        body_parts("multipart/mixed;boundary=x", many_headers)


def test_multipart_round_trip() -> None:
    parts = [BodyPart("application/sdp", "", INVITE_SDP.encode()),
             BodyPart("application/rs-metadata+xml", "recording-session", METADATA_XML.encode())]
    content_type, body = multipart(parts, "callqa-42")
    assert content_type == "multipart/mixed;boundary=callqa-42"
    assert body.startswith(b"--callqa-42\r\nContent-Type: application/sdp\r\n\r\nv=0\r\n")
    assert b"Content-Disposition: recording-session\r\n" in body
    assert body.endswith(b"\r\n--callqa-42--\r\n")
    assert body_parts(content_type, body) == parts
    quoted_type, quoted_body = multipart(parts, "needs quoting?")
    assert quoted_type == 'multipart/mixed;boundary="needs quoting?"'
    assert body_parts(quoted_type, quoted_body) == parts


def test_multipart_refuses_what_it_could_not_write_correctly() -> None:
    with pytest.raises(BodyError, match="contains the boundary"):
        multipart([BodyPart("text/plain", "", b"a\r\n--b\r\n")], "b")
    with pytest.raises(BodyError, match="boundary"):
        multipart([BodyPart("text/plain", "", b"a")], "bad\r\nboundary")
    with pytest.raises(BodyError, match="parts"):
        multipart([], "b")
    with pytest.raises(BodyError, match="content type"):
        multipart([BodyPart("text plain", "", b"a")], "b")


def test_fuzzed_bodies_raise_only_body_error() -> None:
    rng = random.Random(2046)
    parsed = 0
    for _ in range(3000):
        data = bytearray(INVITE_BODY)
        if rng.random() < 0.4:
            data = data[: rng.randrange(len(data) + 1)]
        for _ in range(rng.randrange(6)):
            if data:
                data[rng.randrange(len(data))] = rng.choice(b"-\r\n:; \"xO\x00\xff")
        content_type = INVITE_CONTENT_TYPE
        if rng.random() < 0.2:
            chars = list(content_type)
            chars[rng.randrange(len(chars))] = rng.choice('";= \\x')
            content_type = "".join(chars)
        try:
            parts = body_parts(content_type, bytes(data))
        except BodyError:
            continue
        assert all(isinstance(part, BodyPart) for part in parts)
        parsed += 1
    assert parsed > 100
