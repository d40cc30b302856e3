"""Recording metadata (RFC 7865) in the dialects SBCs write, and what the recorder asks of it."""

from __future__ import annotations

import random

import pytest

from pipeline.gateway.siprec.metadata import (
    MAX_METADATA_BYTES,
    MAX_PARTICIPANTS,
    MetadataError,
    Participant,
    RecordingMetadata,
    build_metadata,
    parse_metadata,
)
from tests.gateway.siprec.examples import (
    AGENT_AOR,
    AGENT_ID,
    AGENT_STREAM,
    CALLER_AOR,
    CALLER_ID,
    CALLER_STREAM,
    METADATA_XML,
)

NS = "urn:ietf:params:xml:ns:recording:1"


def test_siprec_example_metadata() -> None:
    metadata = parse_metadata(METADATA_XML.encode())
    assert metadata.datamode == "complete"
    assert metadata.participants == {CALLER_ID: Participant(CALLER_ID, CALLER_AOR),
                                     AGENT_ID: Participant(AGENT_ID, AGENT_AOR)}
    assert metadata.stream_labels == {CALLER_STREAM: "1", AGENT_STREAM: "2"}
    assert metadata.sends == {CALLER_ID: (CALLER_STREAM,), AGENT_ID: (AGENT_STREAM,)}
    assert metadata.participant_of_label("1") == Participant(CALLER_ID, CALLER_AOR)
    assert metadata.participant_of_label("2") == Participant(AGENT_ID, AGENT_AOR)
    assert metadata.participant_of_label("3") is None


def test_display_names_are_not_kept() -> None:
    metadata = parse_metadata(METADATA_XML.encode())
    assert "Pat Example" in METADATA_XML
    assert "Pat Example" not in repr(metadata)


def test_draft_form_send_inside_participant_with_id_attributes_and_old_namespace() -> None:
    xml = b"""<?xml version="1.0"?>
<recording xmlns="urn:ietf:params:xml:ns:recording">
  <datamode>complete</datamode>
  <participant id="p1" session="s"><nameID aor="sip:alice@example.com"><name>Alice</name></nameID>
    <send>st1</send><recv>st2</recv></participant>
  <participant id="p2"><aor>sip:bob@example.com</aor><send>st2</send></participant>
  <stream id="st1" session="s"><label>10</label></stream>
  <stream id="st2" session="s"><label>11</label></stream>
</recording>"""
    metadata = parse_metadata(xml)
    assert metadata.participant_of_label("10") == Participant("p1", "sip:alice@example.com")
    assert metadata.participant_of_label("11") == Participant("p2", "sip:bob@example.com")


def test_elements_without_namespace_and_unknown_elements() -> None:
    xml = b"""<recording xmlns:v="urn:vendor:x">
  <v:participant participant_id="vendor"><v:nameID aor="sip:nobody@x"/></v:participant>
  <participant participant_id="p1"><nameID aor=" sip:alice@example.com "/><nameID aor="sip:second@x"/>
    <v:extra>ignored</v:extra></participant>
  <group group_id="g"><associate-time>2024-01-01T00:00:00Z</associate-time></group>
  <stream stream_id="s1"><label>1</label><v:codec>pcmu</v:codec></stream>
  <stream stream_id="s-unlabelled"/>
  <participantstreamassoc participant_id="p1"><send>s1</send><send>s1</send><recv>s9</recv></participantstreamassoc>
  <!-- a comment --><?pi ignored?>
</recording>"""
    metadata = parse_metadata(xml)
    assert metadata.participants == {"p1": Participant("p1", "sip:alice@example.com")}
    assert metadata.stream_labels == {"s1": "1"}
    assert metadata.sends == {"p1": ("s1",)}


def test_association_owner_as_a_child_element() -> None:
    xml = f"""<recording xmlns="{NS}"><participant participant_id="p1"><nameID aor="sip:a@x"/></participant>
<stream stream_id="s1"><label>7</label></stream>
<participantstreamassoc participantstreamassoc_id="z"><participant_id>p1</participant_id><send>s1</send>
</participantstreamassoc></recording>""".encode()
    assert parse_metadata(xml).participant_of_label("7") == Participant("p1", "sip:a@x")


def test_partial_update_merges_and_complete_replaces() -> None:
    first = parse_metadata(METADATA_XML.encode())
    # A transfer: the agent's stream (label 2) is now a supervisor's new stream, and the supervisor joins.
    partial = parse_metadata(f"""<recording xmlns="{NS}"><datamode>partial</datamode>
<participant participant_id="sup"><nameID aor="sip:supervisor7@pbx.example.com"/></participant>
<stream stream_id="new-stream"><label>2</label></stream>
<participantstreamassoc participant_id="sup"><send>new-stream</send></participantstreamassoc>
</recording>""".encode())
    assert partial.datamode == "partial"
    merged = first.merged(partial)
    assert merged.datamode == "complete"
    assert merged.participant_of_label("1") == Participant(CALLER_ID, CALLER_AOR)
    assert merged.participant_of_label("2") == Participant("sup", "sip:supervisor7@pbx.example.com")
    assert AGENT_STREAM not in merged.stream_labels
    assert set(merged.participants) == {CALLER_ID, AGENT_ID, "sup"}
    assert first.participant_of_label("2") == Participant(AGENT_ID, AGENT_AOR)  # the original is unchanged
    complete = RecordingMetadata("complete", {"x": Participant("x", "sip:x@y")}, {"s": "1"}, {"x": ("s",)})
    assert first.merged(complete) == complete


@pytest.mark.parametrize(("xml", "says"), [
    (b'<?xml version="1.0"?><!DOCTYPE recording [<!ENTITY a "aaaa">]><recording>&a;</recording>', "refused"),
    (b'<?xml version="1.0"?><!DOCTYPE recording SYSTEM "http://example.com/x.dtd"><recording/>', "refused"),
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><recording>&x;</recording>',
     "refused"),
    (b"<recording><participant", "not well-formed"),
    (b"", "not well-formed"),
    (b"\xff\xfe<\x00", "metadata"),
    (b'<?xml version="1.0" encoding="no-such-codec"?><recording/>', "metadata"),
    (b"<other xmlns='urn:ietf:params:xml:ns:recording:1'/>", "not recording"),
    (b"<recording xmlns='urn:vendor'/>", "not recording"),
    (b"<recording><datamode>sometimes</datamode></recording>", "datamode must be complete or partial"),
    (b"<recording><participant><nameID aor='sip:a@x'/></participant></recording>", "participant 1 has no"),
    (b"<recording><stream><label>1</label></stream></recording>", "stream 1 has no stream_id"),
    (b"<recording><participantstreamassoc><send>s</send></participantstreamassoc></recording>", "no participant_id"),
])
def test_refused_metadata(xml: bytes, says: str) -> None:
    with pytest.raises(MetadataError, match=says):
        parse_metadata(xml)


def test_bounds() -> None:
    with pytest.raises(MetadataError, match=f"more than {MAX_METADATA_BYTES}"):
        parse_metadata(b"<recording>" + b" " * MAX_METADATA_BYTES + b"</recording>")
    many = "".join(f'<participant participant_id="p{i}"/>' for i in range(MAX_PARTICIPANTS + 1))
    with pytest.raises(MetadataError, match=f"more than {MAX_PARTICIPANTS} participants"):
        parse_metadata(f"<recording>{many}</recording>".encode())


def test_build_metadata_round_trip() -> None:
    xml = build_metadata("sess&1", [("p1", "sip:+15551234567@carrier.example.com;user=phone&x", "s1", "1"),
                                    ("p2", "sip:agent1001@pbx.example.com", "s2", "2"),
                                    ("p2", "sip:agent1001@pbx.example.com", "s3", "3")])
    assert xml.startswith(b"<?xml")
    assert b'xmlns="urn:ietf:params:xml:ns:recording:1"' in xml
    assert b"<participantstreamassoc" in xml
    metadata = parse_metadata(xml)
    assert metadata.datamode == "complete"
    assert metadata.participant_of_label("1") == Participant("p1", "sip:+15551234567@carrier.example.com;user=phone&x")
    assert metadata.participant_of_label("3") == Participant("p2", "sip:agent1001@pbx.example.com")
    assert metadata.sends == {"p1": ("s1",), "p2": ("s2", "s3")}
    assert metadata.stream_labels == {"s1": "1", "s2": "2", "s3": "3"}


def test_fuzzed_metadata_raises_only_metadata_error() -> None:
    rng = random.Random(7865)
    seeds = [METADATA_XML.encode(), build_metadata("s", [("p1", "sip:a@x", "s1", "1"), ("p2", "sip:b@x", "s2", "2")])]
    parsed = 0
    for _ in range(2000):
        data = bytearray(rng.choice(seeds))
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data) + 1)]
        for _ in range(rng.randrange(4)):
            if data:
                data[rng.randrange(len(data))] = rng.choice(b"<>&;\"'/=!x \x00\xff")
        if rng.random() < 0.2:
            start = rng.randrange(len(data) + 1)
            data[start:start] = data[rng.randrange(len(data) + 1):][:rng.randrange(200)]
        try:
            metadata = parse_metadata(bytes(data))
        except MetadataError:
            continue
        assert isinstance(metadata, RecordingMetadata)
        metadata.participant_of_label("1")
        parsed += 1
    assert parsed > 50
