"""Recording metadata (RFC 7865, ``urn:ietf:params:xml:ns:recording:1``): who is on the recorded call
and which labelled stream carries whose voice.

The recording server needs exactly that much: participants by id with their address of record, the
label of each stream (it matches the SDP's ``a=label``), and which streams each participant sends.
Display names are dropped on purpose: they are personal data the pipeline has no use for.

SBCs write this XML in more than one dialect, so the reader accepts both RFC 7865's
``<participantstreamassoc participant_id=..><send>..</send></participantstreamassoc>`` and the older
draft's ``<send>`` inside ``<participant>``, ``participant_id``/``stream_id`` or the draft's ``id``
attributes, and elements in the namespace or in none. Unknown elements are read past.

The XML comes off the network: it is bounded in size and counts, parsed with defusedxml with DTDs and
entities refused, and every failure is a :class:`MetadataError`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

MAX_METADATA_BYTES = 64 * 1024
MAX_PARTICIPANTS = 64
MAX_STREAMS = 64
NAMESPACE = "urn:ietf:params:xml:ns:recording:1"
# The drafts before RFC 7865 used the namespace without its version; some SBCs still send it.
ACCEPTED_NAMESPACES = ("", NAMESPACE, "urn:ietf:params:xml:ns:recording")
DATAMODES = ("complete", "partial")


class MetadataError(ValueError):
    """Recording metadata we cannot use; the message says which element and what is wrong."""


@dataclass(frozen=True)
class Participant:
    participant_id: str
    aor: str  # the first nameID's aor ("sip:+15551234567@carrier.example.com"), "" when none is given


@dataclass(frozen=True)
class RecordingMetadata:
    datamode: str
    participants: dict[str, Participant]
    stream_labels: dict[str, str]  # stream_id -> the SDP a=label of the stream
    sends: dict[str, tuple[str, ...]]  # participant_id -> the stream_ids it sends

    def participant_of_label(self, label: str) -> Participant | None:
        """The participant who sends the stream labelled ``label`` (the first, in a mixed stream)."""
        streams = {stream_id for stream_id, stream_label in self.stream_labels.items() if stream_label == label}
        for participant_id, sent in self.sends.items():
            if streams.intersection(sent) and participant_id in self.participants:
                return self.participants[participant_id]
        return None

    def merged(self, update: RecordingMetadata) -> RecordingMetadata:
        """This metadata after ``update`` (a re-INVITE's or UPDATE's): a complete one replaces it, a
        partial one (RFC 7865 §6.1) changes only what it names; :class:`MetadataError` when the result
        would pass the bounds one document has."""
        if update.datamode == "complete":
            return update
        # A label now given to another stream no longer names the old one (a stream was replaced).
        relabelled = set(update.stream_labels.values())
        labels = {sid: label for sid, label in self.stream_labels.items() if label not in relabelled}
        labels.update(update.stream_labels)
        merged = RecordingMetadata(
            datamode=self.datamode,
            participants={**self.participants, **update.participants},
            stream_labels=labels,
            sends={**self.sends, **update.sends},
        )
        # Each document is bounded by the parser; a session's partial updates add up, so the sum is too.
        if len(merged.participants) > MAX_PARTICIPANTS or len(merged.sends) > MAX_PARTICIPANTS:
            raise MetadataError(f"metadata: more than {MAX_PARTICIPANTS} participants in the session")
        if len(merged.stream_labels) > MAX_STREAMS:
            raise MetadataError(f"metadata: more than {MAX_STREAMS} streams in the session")
        return merged


def parse_metadata(xml: bytes) -> RecordingMetadata:
    """Read an ``application/rs-metadata+xml`` body; raises only :class:`MetadataError`."""
    root = _parse_xml(xml)
    if _local(root) != "recording":
        raise MetadataError(f"metadata: root element is {root.tag[:60]!r}, not recording")
    datamode = "complete"
    participants: dict[str, Participant] = {}
    stream_labels: dict[str, str] = {}
    sends: dict[str, list[str]] = {}
    for child in root:
        name = _local(child)
        if name == "datamode":
            datamode = _datamode(child)
        elif name == "participant":
            participant = _participant(child, len(participants) + 1)
            if participant.participant_id not in participants and len(participants) == MAX_PARTICIPANTS:
                raise MetadataError(f"metadata: more than {MAX_PARTICIPANTS} participants")
            participants[participant.participant_id] = participant
            _add_sends(sends, participant.participant_id, _texts(child, "send"))
        elif name == "stream":
            stream_id, label = _stream(child, len(stream_labels) + 1)
            if label is not None:
                if stream_id not in stream_labels and len(stream_labels) == MAX_STREAMS:
                    raise MetadataError(f"metadata: more than {MAX_STREAMS} streams")
                stream_labels[stream_id] = label
        elif name == "participantstreamassoc":
            _add_sends(sends, _association_owner(child), _texts(child, "send"))
    return RecordingMetadata(datamode, participants, stream_labels,
                             {pid: tuple(streams) for pid, streams in sends.items()})


def _parse_xml(xml: bytes) -> ElementTree.Element:
    if len(xml) > MAX_METADATA_BYTES:
        raise MetadataError(f"metadata: {len(xml)} bytes, more than {MAX_METADATA_BYTES}")
    try:
        root = fromstring(xml, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as error:
        raise MetadataError(f"metadata: refused ({type(error).__name__})") from None
    except ElementTree.ParseError as error:
        raise MetadataError(f"metadata: not well-formed XML ({error})") from None
    except (ValueError, TypeError, LookupError, RecursionError) as error:
        raise MetadataError(f"metadata: unreadable ({type(error).__name__})") from None
    if not isinstance(root, ElementTree.Element):
        raise MetadataError("metadata: no root element")
    return root


def _local(element: ElementTree.Element) -> str | None:
    """The element's name without namespace, or None for an element of some other namespace."""
    tag = element.tag
    if not isinstance(tag, str):  # comments and processing instructions
        return None
    namespace, _, local = tag[1:].rpartition("}") if tag.startswith("{") else ("", "", tag)
    return local if namespace in ACCEPTED_NAMESPACES else None


def _child_named(element: ElementTree.Element, name: str) -> Iterator[ElementTree.Element]:
    return (child for child in element if _local(child) == name)


def _texts(element: ElementTree.Element, name: str) -> list[str]:
    return [(child.text or "").strip() for child in _child_named(element, name) if (child.text or "").strip()]


def _attribute(element: ElementTree.Element, *names: str) -> str | None:
    for name in names:
        value = element.get(name)
        if value is not None and value.strip():
            return value.strip()
    return None


def _datamode(element: ElementTree.Element) -> str:
    text = (element.text or "").strip()
    if text in DATAMODES:
        return text
    raise MetadataError(f"metadata: datamode must be complete or partial, got {text[:20]!r}")


def _participant(element: ElementTree.Element, number: int) -> Participant:
    participant_id = _attribute(element, "participant_id", "id")
    if participant_id is None:
        raise MetadataError(f"metadata: participant {number} has no participant_id")
    name_ids = list(_child_named(element, "nameID"))
    if name_ids:
        return Participant(participant_id, (name_ids[0].get("aor") or "").strip())
    # Some older SBCs write the address as an <aor> element of its own.
    texts = _texts(element, "aor")
    return Participant(participant_id, texts[0] if texts else "")


def _stream(element: ElementTree.Element, number: int) -> tuple[str, str | None]:
    stream_id = _attribute(element, "stream_id", "id")
    if stream_id is None:
        raise MetadataError(f"metadata: stream {number} has no stream_id")
    labels = _texts(element, "label")
    return stream_id, labels[0] if labels else None


def _association_owner(element: ElementTree.Element) -> str:
    participant_id = _attribute(element, "participant_id", "id")
    if participant_id is None:
        # Some SBCs wrote the owner as a child element.
        texts = _texts(element, "participant_id")
        participant_id = texts[0] if texts else None
    if participant_id is None:
        raise MetadataError("metadata: participantstreamassoc has no participant_id")
    return participant_id


def _add_sends(sends: dict[str, list[str]], participant_id: str, stream_ids: list[str]) -> None:
    if not stream_ids:
        return
    known = sends.setdefault(participant_id, [])
    for stream_id in stream_ids:
        if stream_id not in known:
            if len(known) == MAX_STREAMS:
                raise MetadataError(f"metadata: participant {participant_id[:40]!r} sends more than "
                                    f"{MAX_STREAMS} streams")
            known.append(stream_id)


def build_metadata(session_id: str, participants: Sequence[tuple[str, str, str, str]]) -> bytes:
    """RFC 7865 metadata (datamode complete) for a client: one entry per ``(participant_id, aor,
    stream_id, label)``; a participant named twice sends both streams, and receives everyone else's."""
    # Unqualified names under an xmlns attribute: ElementTree's default_namespace cannot write the
    # unqualified attributes (participant_id, ...) RFC 7865 uses.
    root = ElementTree.Element("recording", xmlns=NAMESPACE)
    ElementTree.SubElement(root, "datamode").text = "complete"
    ElementTree.SubElement(root, "session", session_id=session_id)
    owners: dict[str, list[str]] = {}
    for participant_id, aor, stream_id, _label in participants:
        if participant_id not in owners:
            owners[participant_id] = []
            participant = ElementTree.SubElement(root, "participant", participant_id=participant_id)
            ElementTree.SubElement(participant, "nameID", aor=aor)
            ElementTree.SubElement(root, "participantsessionassoc", participant_id=participant_id,
                                   session_id=session_id)
        owners[participant_id].append(stream_id)
    for _pid, _aor, stream_id, label in participants:
        stream = ElementTree.SubElement(root, "stream", stream_id=stream_id, session_id=session_id)
        ElementTree.SubElement(stream, "label").text = label
    for participant_id, sent in owners.items():
        association = ElementTree.SubElement(root, "participantstreamassoc", participant_id=participant_id)
        for stream_id in sent:
            ElementTree.SubElement(association, "send").text = stream_id
        for other, their_streams in owners.items():
            if other != participant_id:
                for stream_id in their_streams:
                    ElementTree.SubElement(association, "recv").text = stream_id
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
