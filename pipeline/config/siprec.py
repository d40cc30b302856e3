"""Settings of the gateway's SIPREC recording server (`callqa gateway --sip-port`, pipeline/gateway/siprec/).

Who may record is three checks, each refusal counted in ``callqa_siprec_refusals_total{reason}`` and logged:
the source address (``siprec_allow``), digest credentials (``siprec_users``) when set, and the caps on
sessions (in all, per source, per tenant) and INVITEs a second. A refused INVITE produces nothing to Kafka.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class SiprecSettings(BaseModel):
    siprec_users: SecretStr = Field(
        SecretStr(""),
        description="Digest credentials SBCs must present, `user:password[,user:password...]` (secret); the user "
        "is the call's tenant. Empty: no digest challenge (the source allow-list still applies).",
    )
    siprec_allow: str = Field(
        "127.0.0.0/8,::1/128",
        description="Source addresses (CIDRs, comma-separated) whose INVITEs are taken; others get 403. The "
        "default takes loopback only: list the SBCs' addresses.",
    )
    siprec_agent_aor: str = Field(
        "",
        description="Regex matched against each participant's AOR (`sip:user@host`): the participant it "
        "matches is the agent, and its user part the agent ID. Empty: the second stream in SDP order "
        "(the callee's on Acme Packet, Ribbon, AudioCodes, CUBE) is the agent.",
    )
    siprec_max_sessions: int = Field(
        1000, ge=1, description="Recording sessions open at once; an INVITE past it gets 503 with Retry-After."
    )
    siprec_max_sessions_per_source: int = Field(
        500, ge=1,
        description="Recording sessions one source address may hold open at once, so one SBC (or a host "
        "allowed by mistake) cannot take every slot of siprec_max_sessions; past it: 503 with Retry-After. "
        "With a single SBC, raise it to siprec_max_sessions.",
    )
    siprec_max_sessions_per_tenant: int = Field(
        500, ge=1,
        description="Recording sessions one tenant (digest user) may hold open at once; past it: 503 with "
        "Retry-After. Applies only with siprec_users set (without digest there are no tenants).",
    )
    siprec_max_hold_s: float = Field(
        3600.0, gt=0,
        description="A session on hold (every recorded stream inactive) skips the media timeout; held longer "
        "than this it is ended with a BYE (an SBC that held a call and lost it) (s).",
    )
    siprec_source_invites_per_s: float = Field(
        20.0, ge=0, description="New INVITEs a second one source address may send (bursts of two seconds' "
        "worth); more get 503 with Retry-After (0: no limit).",
    )
    siprec_media_address: str = Field(
        "",
        description="Address put in the SDP answer's c= line for the RTP ports; empty: the address the "
        "INVITE arrived on.",
    )
    siprec_jitter_packets: int = Field(
        4, ge=0, le=50,
        description="RTP packets held per stream to put reordered ones back in order (each 20 ms); 0 "
        "releases every packet at once (reordered ones are then dropped as late).",
    )
    siprec_jitter_wait_ms: float = Field(
        60.0, ge=0, description="Longest a held RTP packet waits for an earlier one (ms) before it is released."
    )
    siprec_media_timeout_s: float = Field(
        60.0, gt=0,
        description="A session with neither RTP nor SIP for this long is ended (an SBC that vanished without "
        "BYE) (s).",
    )
    siprec_srtp: Literal["optional", "required"] = Field(
        "optional",
        description="required: an offer without SDES SRTP (a=crypto AES_CM_128_HMAC_SHA1_80) is refused with "
        "488, so card data travels encrypted or not at all.",
    )

    @field_validator("siprec_allow")
    @classmethod
    def _cidrs(cls, value: str) -> str:
        for i, item in enumerate(x.strip() for x in value.split(",") if x.strip()):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"entry {i + 1} is not a CIDR: {item!r}") from None
        return value

    def allowed_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(x.strip(), strict=False) for x in self.siprec_allow.split(",") if x.strip()]
