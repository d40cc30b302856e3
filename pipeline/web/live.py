"""The live desk's pages: the wall of calls in progress (/live) and one call as it happens (/live/{id}).

Each page is whole without script (the snapshot, rendered here, refreshed every 5 s by a <noscript> meta
refresh); its one script, allowed by its hash and nothing else, keeps it current from the desk's event
stream (``/live/events``: EventSource sends the session cookie, not a bearer token), so these are the
pages whose CSP also allows a connection to their own origin.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from pipeline.web.render import PageContext, environment

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WALL_SCRIPT = (SCRIPTS / "live_wall.js").read_text(encoding="utf-8")
CALL_SCRIPT = (SCRIPTS / "live_call.js").read_text(encoding="utf-8")


def script_hash(script: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


LIVE_CSP_META = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; "
                 f"script-src '{script_hash(WALL_SCRIPT)}' '{script_hash(CALL_SCRIPT)}'; form-action 'self'; "
                 "base-uri 'none'")
LIVE_CSP = f"{LIVE_CSP_META}; frame-ancestors 'none'"
SORTS = (("longest", "longest first"), ("sentiment", "worst sentiment first"), ("alerts", "most alerts first"))
SORT_KEYS = {
    "longest": lambda c: (c["started_at_ms"], c["call_id"]),
    "sentiment": lambda c: (c["customer_sentiment"], c["started_at_ms"]),
    "alerts": lambda c: (-c["alerts"], c["started_at_ms"]),
}


def render_live_wall(calls: list[dict[str, Any]], context: PageContext, sort: str = "longest",
                     ready: bool = True) -> str:
    sort = sort if sort in SORT_KEYS else "longest"
    newest = max(calls, key=lambda c: c["last_alert_ms"] + c["started_at_ms"] if c["alerts"] else -1, default=None)
    env = environment()
    return env.get_template("live.html").render(
        calls=sorted(calls, key=SORT_KEYS[sort]), sort=sort, sorts=SORTS, ready=ready,
        newest=newest["call_id"] if newest and newest["alerts"] else "", links=context.links,
        logged_in=context.logged_in, csp=LIVE_CSP_META, script=WALL_SCRIPT,
    )


def render_live_call(call_id: str, view: dict[str, Any], context: PageContext) -> str:
    return environment().get_template("live_call.html").render(
        call_id=call_id, view=view, links=context.links, logged_in=context.logged_in, csp=LIVE_CSP_META,
        script=CALL_SCRIPT,
    )
