"""The call pages as HTML: Jinja2 templates (``templates/``), autoescaped, one per page.

The same templates serve the worker (links to /calls and /calls/{id}, a filter form, a log-out button)
and `callqa report --html DIR` (``write_site``: ``index.html`` and ``calls/<call>.html``, relative
links, no form: a static page has no server to filter for it). Every page carries its styles and its
SVG inline and names no other origin, so it works offline, from a file, under a strict CSP.
"""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from pipeline.desk.calibration import ItemCalibration
from pipeline.desk.search import SEPARATORS, WORD_CHAR
from pipeline.desk.trends import FIGURES, AgentTrend, WeekFigures
from pipeline.web import timeline
from pipeline.web.data import (
    CallPage,
    CallRow,
    FilterOptions,
    ListFilters,
    RowSource,
    read_call_list,
    read_call_page,
)

TEMPLATES = Path(__file__).resolve().parent / "templates"
# What the pages may load: nothing but their own inline styles (no script at all) and data: icons. The
# pages carry it in a <meta> (static files have no headers), where frame-ancestors is not allowed; the
# worker also sends it as a header, with frame-ancestors.
# The call page's one script: a click on a turn's time seeks the recording's player there (without it, the link
# opens the recording at that time: a media fragment). It is allowed by its hash, and nothing else runs.
SEEK_SCRIPT = ("for(const a of document.querySelectorAll('a[data-seek]'))a.addEventListener('click',e=>{"
               "const p=document.getElementById('player');if(!p)return;e.preventDefault();p.currentTime=+a.dataset.seek;"
               "p.play()})")
SEEK_SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SEEK_SCRIPT.encode()).digest()).decode()
CSP_META = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; media-src 'self'; "
            f"script-src '{SEEK_SCRIPT_HASH}'; form-action 'self'; base-uri 'none'")
CSP = f"{CSP_META}; frame-ancestors 'none'"

# Metrics shown on the call page, in this order, with their labels and units (others follow as named).
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "duration_ms": ("call duration", "ms"),
    "talk_ms": ("talk time", "ms"),
    "agent_talk_ms": ("agent talk time", "ms"),
    "customer_talk_ms": ("customer talk time", "ms"),
    "non_talk_ms": ("non-talk time", "ms"),
    "agent_talk_pct": ("agent talk", "%"),
    "customer_talk_pct": ("customer talk", "%"),
    "agent_talk_share_pct": ("agent share of talk", "%"),
    "non_talk_pct": ("non-talk", "%"),
    "overtalk_ms": ("overtalk", "ms"),
    "overtalk_count": ("overtalk periods", ""),
    "agent_interruptions": ("agent interruptions", ""),
    "customer_interruptions": ("customer interruptions", ""),
    "longest_silence_ms": ("longest silence", "ms"),
    "silence_count": ("silences", ""),
    "silence_avg_ms": ("average silence", "ms"),
    "longest_monologue_ms": ("longest monologue", "ms"),
    "agent_longest_monologue_ms": ("agent's longest monologue", "ms"),
    "customer_longest_monologue_ms": ("customer's longest monologue", "ms"),
    "hold_ms": ("on hold", "ms"),
    "holds": ("holds", ""),
    "paused_ms": ("capture paused", "ms"),
    "pauses": ("secure pauses", ""),
    "agent_wpm": ("agent words/min", ""),
    "customer_wpm": ("customer words/min", ""),
    "agent_words": ("agent words", ""),
    "customer_words": ("customer words", ""),
    "first_agent_response_ms": ("first agent response", "ms"),
    "agent_first_speech_ms": ("agent's first word", "ms"),
    "turn_count": ("turns", ""),
}


@dataclass(frozen=True)
class ServerLinks:
    """Links of pages the worker serves."""

    static: bool = False

    def call(self, call_id: str) -> str:
        return "/calls/" + urllib.parse.quote(call_id, safe="")

    def calls(self, query: Mapping[str, str] | None = None) -> str:
        return "/calls" + (f"?{urllib.parse.urlencode(query)}" if query else "")

    def agent(self, agent_id: str) -> str | None:
        return "/agents/" + urllib.parse.quote(agent_id, safe="")

    def audio(self, call_id: str) -> str | None:
        return "/calls/" + urllib.parse.quote(call_id, safe="") + "/audio"


@dataclass(frozen=True)
class StaticLinks:
    """Relative links between the files ``write_site`` writes (``index.html``, ``calls/<file>``)."""

    on_call_page: bool = False
    static: bool = True

    def call(self, call_id: str) -> str:
        name = urllib.parse.quote(static_file_name(call_id))
        return name if self.on_call_page else f"calls/{name}"

    def calls(self, query: Mapping[str, str] | None = None) -> str:
        return "../index.html" if self.on_call_page else "index.html"

    def agent(self, agent_id: str) -> str | None:
        return None  # the static files hold no agent pages

    def audio(self, call_id: str) -> str | None:
        return None  # nor recordings: the worker serves them to who may hear them


Links = ServerLinks | StaticLinks
NEUTRAL_BAND = 1.0  # points of −5..+5: pipeline/qa/sentiment.py's neutral band
STRONG = 2.5
PASS_PCT = 70.0  # a score shown in red below this (the supervisor dashboard's default min_score)


def static_file_name(call_id: str) -> str:
    """A file name for the call's page: its id where that is a safe name, else made safe and told apart
    from other ids by a short hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", call_id).lstrip(".")[:100]
    if safe != call_id or not safe:
        safe = f"{safe}-{hashlib.sha256(call_id.encode()).hexdigest()[:10]}"
    return f"{safe}.html"


def sentiment_class(score: float | None) -> str:
    """A CSS class for a score on the −5..+5 scale: five bands, and one for no score. Neutral is below one
    point either way, as pipeline/qa/sentiment.py labels turns; from 2.5 points the colour is strong."""
    if score is None:
        return "sent-none"
    if score <= -STRONG:
        return "sent-neg2"
    if score <= -NEUTRAL_BAND:
        return "sent-neg1"
    if score < NEUTRAL_BAND:
        return "sent-neu"
    return "sent-pos1" if score < STRONG else "sent-pos2"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def _metric(name: str, value: float) -> str:
    guessed = "ms" if name.endswith("_ms") else "%" if name.endswith("_pct") else ""
    unit = METRIC_LABELS.get(name, ("", guessed))[1]
    if unit == "ms":
        return f"{value / 1000:.1f} s"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def _when(value: datetime | None) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


SPARK_BARS = "▁▂▃▄▅▆▇█"


def spark(scores: list[float]) -> str:
    """A sentiment trend (−5..+5 each) as block characters, as the live wall's script draws it."""
    return "".join(SPARK_BARS[max(0, min(7, round((v + 5) / 10 * 7)))] for v in scores)


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(clock=timeline.clock, sentiment_class=sentiment_class, signed=_signed, metric=_metric,
                       when=_when, marked=marked, spark=spark)
    env.globals.update(csp=CSP_META, pass_pct=PASS_PCT, seek_script=SEEK_SCRIPT)
    return env


def marked(text: str, words: tuple[str, ...]) -> Markup:
    """``text`` escaped, with the searched phrase (``words`` side by side, whole, any case) in <mark>."""
    if not words:
        return Markup(escape(text))
    sep = f"[{SEPARATORS}]"
    pattern = re.compile(f"(?<!{WORD_CHAR}){f'{sep}+'.join(map(re.escape, words))}(?!{WORD_CHAR})", re.IGNORECASE)
    out, at = [], 0
    for hit in pattern.finditer(text):
        out += [escape(text[at:hit.start()]), Markup("<mark>"), escape(hit.group(0)), Markup("</mark>")]
        at = hit.end()
    out.append(escape(text[at:]))
    return Markup("").join(out)


@dataclass(frozen=True)
class PageContext:
    """What every page's frame needs."""

    links: Links
    logged_in: bool = False  # the worker's pages show a log-out button


def render_call_list(calls: list[CallRow], context: PageContext, filters: ListFilters | None = None,
                     options: FilterOptions | None = None, error: str | None = None, page_size: int = 0) -> str:
    """The list; with ``page_size`` (the worker's pages) a full page links the calls after its last one."""
    filters = filters or ListFilters()
    options = options or FilterOptions((), (), ())
    query = filters.as_query()
    older = None
    if page_size and len(calls) >= page_size:
        older = context.links.calls(filters.next_page(calls[-1]))
    return environment().get_template("calls.html").render(
        calls=calls, links=context.links, logged_in=context.logged_in, filters=filters, options=options,
        query=query, error=error, older=older, paged=filters.after is not None,
    )


def metric_rows(metrics: Mapping[str, float]) -> list[tuple[str, str, str]]:
    """(name, label, shown value) of every interaction metric: the known ones in order, then the rest by
    name. Sentiment figures are left out: the page's sentiment summary shows them."""
    known = [(n, METRIC_LABELS[n][0], _metric(n, metrics[n])) for n in METRIC_LABELS if n in metrics]
    rest = [(n, n.replace("_", " "), _metric(n, v)) for n, v in metrics.items()
            if n not in METRIC_LABELS and "sentiment" not in n]
    return known + rest


def call_timeline(page: CallPage, silence_threshold_ms: int) -> timeline.Timeline:
    spans = [timeline.Span(t.leg, t.start_ms, t.end_ms, t.anchor, t.sentiment) for t in page.turns]
    alerts = [timeline.AlertMark(a.offset_ms, f"{a.rule}: {a.text}" if a.text else a.rule, a.anchor)
              for a in page.alerts]
    return timeline.layout(page.duration_ms, spans, page.holds, alerts, silence_threshold_ms, pauses=page.pauses,
                           keypad=page.keypad)


@dataclass(frozen=True)
class ReviewForm:
    """The call page's review form (the worker's pages only): where it posts, its CSRF token, the scorecard's
    items (id, question) to choose from."""

    action: str
    token: str
    items: tuple[tuple[str, str], ...]


def render_call_page(page: CallPage, context: PageContext, silence_threshold_ms: int = 5000,
                     review: ReviewForm | None = None) -> str:
    alerted = {a.anchor for a in page.alerts if a.anchor}
    return environment().get_template("call.html").render(
        call=page, links=context.links, logged_in=context.logged_in, review=review,
        timeline=call_timeline(page, silence_threshold_ms), metrics=metric_rows(page.metrics), alerted=alerted,
        sentiment_scored=any(t.sentiment is not None for t in page.turns),
    )


def render_agent_page(trend: AgentTrend, context: PageContext) -> str:
    def figure(week: WeekFigures | None, key: str, unit: str) -> str:
        value = None if week is None else week.values.get(key)
        if value is None:
            return "–"
        return _signed(value) if key == "customer_sentiment" else f"{value:.0f}{' ' + unit if unit else ''}"

    def pass_rate(week: WeekFigures | None, question: str) -> str:
        value = None if week is None else week.items.get(question)
        return "–" if value is None else f"{value:.0f} %"

    return environment().get_template("agent.html").render(
        trend=trend, figures=FIGURES, figure=figure, pass_rate=pass_rate, links=context.links,
        logged_in=context.logged_in)


def render_calibration(items: list[ItemCalibration], questions: Mapping[str, str], context: PageContext) -> str:
    return environment().get_template("calibration.html").render(
        items=items, questions=questions, links=context.links, logged_in=context.logged_in)


def render_login(next_path: str, error: str | None = None, unconfigured: bool = False) -> str:
    return environment().get_template("login.html").render(
        links=ServerLinks(), logged_in=False, next_path=next_path, error=error, unconfigured=unconfigured,
    )


def render_message(title: str, message: str, links: Links, logged_in: bool = False) -> str:
    return environment().get_template("message.html").render(
        title=title, message=message, links=links, logged_in=logged_in,
    )


def write_site(source: RowSource, db: str, out_dir: Path, filters: ListFilters | None = None,
               silence_threshold_ms: int = 5000) -> tuple[Path, int]:
    """The list and every listed call's page as static files under ``out_dir``; returns the list's path
    and the number of calls written."""
    filters = filters or ListFilters()
    calls = read_call_list(source, db, filters)
    pages_dir = out_dir / "calls"
    pages_dir.mkdir(parents=True, exist_ok=True)
    for row in calls:
        page = read_call_page(source, db, row.call_id)
        if page is not None:
            html = render_call_page(page, PageContext(StaticLinks(on_call_page=True)), silence_threshold_ms)
            (pages_dir / static_file_name(row.call_id)).write_text(html, encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_call_list(calls, PageContext(StaticLinks()), filters), encoding="utf-8")
    return index, len(calls)
