"""Settings of live alerts' webhooks: where a rule's or category's ``notify:`` sends its alerts, how the
request is signed, retried and given up (pipeline/notify/)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class NotifySettings(BaseModel):
    # JSON in the environment: CALLQA_WEBHOOKS='{"supervisors": "https://hooks.example.com/qa"}'. A rule names
    # its targets by these names (notify: [supervisors]); an unknown name stops the worker at its start.
    webhooks: dict[str, str] = Field(
        default={}, description="Webhook URLs by name, which rules' and categories' notify: name (JSON).",
    )
    # The receiver checks X-Callqa-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">, the way
    # Stripe and Slack sign theirs, and refuses a stale t (replays).
    webhook_secret: SecretStr = Field(
        SecretStr(""), description="Key of the HMAC-SHA256 signature on every webhook request (required with webhooks).",
    )
    webhook_format: Literal["json", "slack"] = Field(
        "json", description="Body of a webhook request: callqa's JSON, or a Slack incoming-webhook message (text).",
    )
    webhook_timeout_s: float = Field(5.0, gt=0, description="Longest one webhook request may take (s).")
    # Attempts back off 0.5, 1, 2, 4 ... s (capped at webhook_backoff_max_s); after the last, the alert goes to
    # the dead-letter topic with the reason, and the ones behind it go on.
    webhook_attempts: int = Field(6, ge=1, le=20, description="Tries of one webhook request before it is dead-lettered.")
    webhook_backoff_s: float = Field(0.5, gt=0, description="Wait before a webhook's second try; doubled each try after (s).")
    webhook_backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between two tries of a webhook (s).")
    # A receiver that gave up once is not tried again for this long: its alerts go straight to the dead-letter
    # topic, so one dead receiver cannot hold the alerts behind it for minutes each.
    webhook_open_s: float = Field(
        60.0, ge=0, description="After a webhook gave up, how long its next alerts are dead-lettered untried (s).",
    )
    desk_url: str = Field(
        "", description="Where supervisors open the desk (e.g. https://desk.example.com): a webhook links to "
        "<desk_url>/live/<call>. Empty: the worker's own web address.",
    )
