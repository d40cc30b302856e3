"""A SIPREC INVITE's body as an SBC sends it (RFC 7866 §6.1, RFC 7865 metadata), written out by hand so
the tests check the modules against the wire format, not against the modules' own writers.

The SDP offers the two legs of a call as two sendonly audio streams labelled 1 and 2; the metadata
says the caller sends the stream labelled 1 and the agent the one labelled 2.
"""

from __future__ import annotations

CALLER_AOR = "sip:+15551234567@carrier.example.com"
AGENT_AOR = "sip:agent1001@pbx.example.com"
CALLER_ID = "srfBElmCRp2QB23b7Mpk0w=="
AGENT_ID = "zSfPoSvdSDCmU3A3TRDxAw=="
CALLER_STREAM = "i1Pz3to5hGk8fuXl+PbwCw=="
AGENT_STREAM = "8zc6e0lYTlWIINA6GR+3ag=="
SESSION_ID = "hVpd7YQgRW2nD22h7q60JQ=="

INVITE_SDP = (
    "v=0\r\n"
    "o=SBC-SRC 2890844526 2890844526 IN IP4 198.51.100.20\r\n"
    "s=SIP Recording\r\n"
    "c=IN IP4 198.51.100.20\r\n"
    "t=0 0\r\n"
    "m=audio 49170 RTP/AVP 0 8 101\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-15\r\n"
    "a=ptime:20\r\n"
    "a=label:1\r\n"
    "a=sendonly\r\n"
    "m=audio 49172 RTP/AVP 0 8 101\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-15\r\n"
    "a=ptime:20\r\n"
    "a=label:2\r\n"
    "a=sendonly\r\n"
)

METADATA_XML = f"""<?xml version="1.0" encoding="UTF-8"?>
<recording xmlns="urn:ietf:params:xml:ns:recording:1">
  <datamode>complete</datamode>
  <session session_id="{SESSION_ID}">
    <sipSessionID>ab30317f1a784dc48ff824d0d3715d86;remote=47755a9de7794ba387653f2099600ef2</sipSessionID>
    <start-time>2024-05-02T14:03:11Z</start-time>
  </session>
  <participant participant_id="{CALLER_ID}">
    <nameID aor="{CALLER_AOR}">
      <name xml:lang="en">Pat Example</name>
    </nameID>
  </participant>
  <participantsessionassoc participant_id="{CALLER_ID}" session_id="{SESSION_ID}">
    <associate-time>2024-05-02T14:03:11Z</associate-time>
  </participantsessionassoc>
  <participant participant_id="{AGENT_ID}">
    <nameID aor="{AGENT_AOR}">
      <name xml:lang="en">Agent 1001</name>
    </nameID>
  </participant>
  <participantsessionassoc participant_id="{AGENT_ID}" session_id="{SESSION_ID}">
    <associate-time>2024-05-02T14:03:12Z</associate-time>
  </participantsessionassoc>
  <stream stream_id="{CALLER_STREAM}" session_id="{SESSION_ID}">
    <label>1</label>
  </stream>
  <stream stream_id="{AGENT_STREAM}" session_id="{SESSION_ID}">
    <label>2</label>
  </stream>
  <participantstreamassoc participant_id="{CALLER_ID}">
    <send>{CALLER_STREAM}</send>
    <recv>{AGENT_STREAM}</recv>
  </participantstreamassoc>
  <participantstreamassoc participant_id="{AGENT_ID}">
    <send>{AGENT_STREAM}</send>
    <recv>{CALLER_STREAM}</recv>
  </participantstreamassoc>
</recording>
"""

INVITE_BOUNDARY = "OSS-unique-boundary-42"
INVITE_CONTENT_TYPE = f"multipart/mixed;boundary={INVITE_BOUNDARY}"
INVITE_BODY = (
    f"--{INVITE_BOUNDARY}\r\n"
    "Content-Type: application/sdp\r\n"
    "\r\n"
    f"{INVITE_SDP}\r\n"
    f"--{INVITE_BOUNDARY}\r\n"
    "Content-Type: application/rs-metadata+xml\r\n"
    "Content-Disposition: recording-session\r\n"
    "\r\n"
    f"{METADATA_XML}\r\n"
    f"--{INVITE_BOUNDARY}--\r\n"
).encode()
