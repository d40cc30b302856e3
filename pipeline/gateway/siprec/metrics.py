"""The SIPREC server's metrics (``callqa_siprec_*``), in the gateway's registry (served at its /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SiprecMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("callqa_siprec_requests_total", "SIP requests received, by method.", ["method"],
                                registry=r)
        self.retransmissions = Counter("callqa_siprec_retransmissions_total",
                                       "Requests that repeated one already answered (answered again, not redone).",
                                       registry=r)
        self.malformed = Counter("callqa_siprec_malformed_total",
                                 "SIP messages refused unparsed: answered 400 or dropped when unanswerable.",
                                 ["outcome"], registry=r)
        self.refusals = Counter("callqa_siprec_refusals_total",
                                "Requests refused, by reason (source_not_allowed, bad_response, replayed_nonce, "
                                "session_limit, source_session_limit, tenant_session_limit, invite_rate, "
                                "reoffer_rate, bad_call_id, bad_sdp, metadata_limit, ...); nothing reaches Kafka "
                                "for them.", ["reason"], registry=r)
        self.challenges = Counter("callqa_siprec_digest_challenges_total",
                                  "INVITEs without credentials answered with a digest challenge (401).", registry=r)
        self.sessions = Counter("callqa_siprec_sessions_total", "Recording sessions opened.", ["outcome"], registry=r)
        self.sessions_active = Gauge("callqa_siprec_sessions_active", "Recording sessions open now.", registry=r)
        self.sessions_ended = Counter("callqa_siprec_sessions_ended_total",
                                      "Recording sessions ended, by what ended them (bye, media timeout, ...).",
                                      ["reason"], registry=r)
        self.rtp_packets = Counter("callqa_siprec_rtp_packets_total",
                                   "RTP packets by what became of them (audio, lost, late, duplicate, dtmf, "
                                   "comfort_noise, unknown_payload, malformed, srtp_*, wrong_source: from "
                                   "another address than the stream's latched one).", ["outcome"], registry=r)
