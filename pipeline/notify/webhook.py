"""One alert as a webhook request: its body (callqa's JSON or a Slack message), its signature, its sending.

The signature is ``X-Callqa-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``: the
receiver recomputes it over the raw body and refuses a stale ``t`` (a replayed request). ``X-Callqa-Delivery``
names the alert (topic, partition, offset): the same on every try and after a restart, so a receiver that got
a request twice (a worker that died between sending and recording it) can tell.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.messages import QaAlert


@dataclass(frozen=True)
class Delivery:
    """Where an alert came from on the QA topic: its id for the receiver."""

    topic: str
    partition: int
    offset: int

    @property
    def id(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"


class WebhookError(RuntimeError):
    """One try failed: the receiver answered other than 2xx, or could not be reached."""


def body_of(alert: QaAlert, link: str, form: str) -> bytes:
    """The request's body: the alert with a link to its call on the live desk; ``slack``: a message Slack's
    incoming webhooks take (``text``)."""
    clock = f"{alert.offset_ms // 60000}:{alert.offset_ms // 1000 % 60:02d}"
    if form == "slack":
        text = (f"*{alert.rule}* ({alert.severity}) on call <{link}|{alert.call_id}> at {clock}, "
                f"{alert.leg}: \u201c{alert.text}\u201d")
        return json.dumps({"text": text}).encode()
    payload: dict[str, Any] = {
        "call_id": alert.call_id, "rule": alert.rule, "category": alert.category, "severity": alert.severity,
        "leg": alert.leg, "call_time_ms": alert.offset_ms, "text": alert.text, "detected_at_ms": alert.detected_at_ms,
        "live_url": link,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def live_link(desk_url: str, call_id: str) -> str:
    return f"{desk_url.rstrip('/')}/live/{urllib.parse.quote(call_id, safe='')}"


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """One try; the status of a 2xx answer, else ``WebhookError`` with a one-line reason (never the body sent)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - the operator's URL
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        raise WebhookError(f"answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise WebhookError(f"not reached ({type(reason).__name__}: {reason})") from None
