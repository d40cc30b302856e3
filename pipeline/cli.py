"""`callqa`: one command line for the broker, topics, schemas, replay, models, worker and reports.

Errors print as one line; `--verbose` shows the traceback too.
"""

from __future__ import annotations

import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.exceptions import TyperException

from pipeline.bench.cli import bench_app
from pipeline.config import Settings, get_settings
from pipeline.gateway.cli import gateway_app, pause_call, resume_call

if TYPE_CHECKING:
    from pipeline.desk.search import FoundCall, SearchQuery
    from pipeline.ingest.replay import CallRecording, ReplayOptions

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
broker_app = typer.Typer(no_args_is_help=True, help="The local Kafka broker (KRaft, 127.0.0.1).")
topics_app = typer.Typer(no_args_is_help=True, help="callqa's Kafka topics.")
schemas_app = typer.Typer(no_args_is_help=True, help="Avro contracts and their schema ids.")
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
app.add_typer(bench_app, name="bench")
app.add_typer(gateway_app, name="gateway")
app.command("pause")(pause_call)  # secure pause of a live call: pipeline/gateway/pause.py
app.command("resume")(resume_call)
users_app = typer.Typer(no_args_is_help=True, help="Accounts: who may see which tenant's calls through the API.")
app.add_typer(users_app, name="users")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
_state = {"verbose": False}


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks on errors.")] = False) -> None:
    _state["verbose"] = verbose


# ---- broker -------------------------------------------------------------------------------------
@broker_app.command("install")
def broker_install() -> None:
    """Resolve the Kafka jars with Maven (once)."""
    from pipeline.broker.local import LocalKafka

    with console.status("resolving Kafka jars with Maven..."):
        libs = LocalKafka(get_settings()).install()
    console.print(f"Kafka jars in {libs}")


@broker_app.command("start")
def broker_start(
    sasl_ssl: Annotated[bool, typer.Option(
        "--sasl-ssl", help="SASL_SSL client listener (own CA; PLAIN and SCRAM users from CALLQA_KAFKA_SASL_*).")] = False,
) -> None:
    """Start the broker; returns once it answers metadata requests."""
    from pipeline.broker.local import LocalKafka

    settings = get_settings()
    if sasl_ssl:
        settings = settings.model_copy(update={"kafka_local_listener": "SASL_SSL"})
    kafka = LocalKafka(settings)
    with console.status("starting Kafka (KRaft) on 127.0.0.1..."):
        result = kafka.start()
    where = f"127.0.0.1:{settings.kafka_port} ({kafka.listener})"
    if result.already_running:
        console.print(f"broker already running (pid {result.pid}) at {where}; not starting another")
    else:
        console.print(f"broker ready at {where} (pid {result.pid}) in [bold]{result.ready_after_s:.1f} s[/bold]")
    if kafka.sasl_ssl:
        console.print(f"clients: CALLQA_KAFKA_SECURITY_PROTOCOL=SASL_SSL CALLQA_KAFKA_SSL_CA_FILE={kafka.tls.ca_cert} "
                      f"and user {settings.kafka_sasl_username!r} (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the broker this project started (idempotent)."""
    from pipeline.broker.local import LocalKafka

    stopped = LocalKafka(get_settings()).stop()
    console.print("broker stopped" if stopped else "no broker running")


@broker_app.command("status")
def broker_status(
    as_json: Annotated[bool, typer.Option(
        "--json", help='The same as one JSON object on stdout: {"running", "pid", "bootstrap", "answers_metadata", '
                       '"topics": {name: partitions}}.')] = False,
) -> None:
    """Show the broker and its topics (exit status 1 when it is not running)."""
    from dataclasses import asdict

    from pipeline.broker.local import LocalKafka
    from pipeline.tables import keep_whole, print_json, print_table

    st = LocalKafka(get_settings()).status()
    if as_json:
        print_json(asdict(st))
    elif st.running:
        console.print(f"broker: running (pid {st.pid}) at {st.bootstrap}; answers metadata: {st.answers_metadata}")
        table = keep_whole(Table("topic", "partitions"), "topic", "partitions")
        for name, parts in st.topics.items():
            table.add_row(escape(name), str(parts))
        print_table(console, table)
    else:
        console.print("broker: not running")
    if not st.running:
        raise typer.Exit(1)


# ---- topics / schemas ---------------------------------------------------------------------------
@topics_app.command("create")
def topics_create(
    as_json: Annotated[bool, typer.Option(
        "--json", help='The same rows as a JSON list on stdout: {"topic", "partitions", "retention_ms", '
                       '"created"}.')] = False,
) -> None:
    """Create callqa's topics that do not exist yet (idempotent)."""
    from pipeline.broker.topics import ensure_topics, topic_specs
    from pipeline.tables import keep_whole, print_json, print_table

    settings = get_settings()
    created = ensure_topics(settings)
    rows: list[dict[str, Any]] = [
        {"topic": spec.name, "partitions": spec.partitions, "retention_ms": spec.retention_ms,
         "created": spec.name in created} for spec in topic_specs(settings)]
    if as_json:
        print_json(rows)
        return
    table = keep_whole(Table("topic", "partitions", "retention ms", "state", title="callqa topics"),
                       "topic", "partitions", "retention ms", "state")
    for row in rows:
        table.add_row(escape(row["topic"]), str(row["partitions"]), str(row["retention_ms"]),
                      "created" if row["created"] else "exists")
    print_table(console, table)


@schemas_app.command("register")
def schemas_register() -> None:
    """Register the schemas/*.avsc files: in the Schema Registry if configured, else in schemas/registry.json."""
    from pipeline.contracts.registry import ConfluentSchemaRegistry, FileSchemaRegistry
    from pipeline.contracts.serde import SCHEMAS_DIR, load_schema_files

    settings = get_settings()
    for name, schema in load_schema_files().items():
        if settings.schema_registry_url:
            sid = ConfluentSchemaRegistry(settings.schema_registry_url).id_for(name, schema)
            console.print(f"{name}: id {sid}")
        else:
            sid, created = FileSchemaRegistry(SCHEMAS_DIR / "registry.json").register(name, schema)
            console.print(f"{name}: id {sid}{' (new version)' if created else ''}")


# ---- replay -------------------------------------------------------------------------------------
@app.command("replay")
def replay(
    paths: Annotated[list[Path], typer.Argument(
        help="Recordings, mono or stereo (left agent, right customer), any rate: WAV (PCM, float, μ-law, A-law), "
             "FLAC, OGG Vorbis/Opus, MP3, ..., or headerless .ulaw/.alaw (8 kHz), .raw/.pcm (16 kHz).")],
    calls: Annotated[int, typer.Option(help="Concurrent calls to run, cycling over the inputs (0: one per file).")] = 0,
    realtime: Annotated[bool, typer.Option("--realtime/--fast", help="Pace frames in real time, or as fast as possible.")] = False,
    frame_ms: Annotated[int, typer.Option(
        help="Audio per message in ms (0: CALLQA_AUDIO_MESSAGE_MS).", min=0, max=1000)] = 0,
    encoding: Annotated[str, typer.Option(help="Telephony encoding: mulaw, alaw or pcm16.")] = "mulaw",
    tenant: Annotated[str, typer.Option(help="The calls' tenant (default: the worker's CALLQA_DEFAULT_TENANT).")] = "",
) -> None:
    """Play recordings into Kafka as telephony calls: start event, per-leg frames, end event."""
    from pipeline.broker.producer import ContractProducer
    from pipeline.broker.topics import ensure_topics
    from pipeline.contracts import Serde
    from pipeline.ingest.replay import ReplayOptions, TelephonyReplay

    if encoding not in ("mulaw", "alaw", "pcm16"):
        raise typer.BadParameter(f"unknown encoding {encoding!r}: use mulaw, alaw or pcm16")
    settings = get_settings()
    frame_ms = frame_ms or settings.audio_message_ms
    options = ReplayOptions(frame_ms=frame_ms, encoding=encoding, realtime=realtime, calls=calls,  # type: ignore[arg-type]
                            tenant=tenant)
    recordings = _load_recordings(paths, options)
    ensure_topics(settings)
    producer = ContractProducer.from_settings(settings, Serde.from_settings(settings.schema_registry_url))
    player = TelephonyReplay(producer, settings.topic_audio, settings.topic_call_events)
    n_calls = options.calls or len(recordings)
    frame_samples = {r.source: r.sample_rate * frame_ms // 1000 for r in recordings}
    total = sum(
        sum(r.frame_count(leg, frame_samples[r.source]) for leg in r.legs)
        for r in (recordings[i % len(recordings)] for i in range(n_calls))
    )
    with Progress(TextColumn("[bold]replay[/bold]"), BarColumn(), MofNCompleteColumn(), TextColumn("frames"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("frames", total=total)
        report = player.run(recordings, options, on_frames=lambda n: progress.advance(task, n))
    console.print(
        f"replayed {len(report.call_ids)} calls, {report.frames_sent} frames, {report.events_sent} events "
        f"in {report.elapsed_s:.2f} s ({report.frames_per_s:,.0f} frames/s)"
    )
    for call_id in report.call_ids:
        legs = ", ".join(f"{leg} {n}" for leg, n in report.frames_per_leg[call_id].items())
        console.print(f"  {call_id}: {legs}")


def _load_recordings(paths: list[Path], options: ReplayOptions) -> list[CallRecording]:
    """Every file read before anything is sent: one line per unreadable file, then exit status 1."""
    from pipeline.audio.files import AudioFileError
    from pipeline.ingest.replay import load_recording

    recordings, failed = [], 0
    for path in paths:
        try:
            recordings.append(load_recording(path, options))
        except AudioFileError as exc:
            failed += 1
            err_console.print(f"[red]error:[/red] {escape(str(exc))}")
    if failed:
        if len(paths) > 1:
            err_console.print(f"{failed} of {len(paths)} files unreadable: nothing replayed")
        raise typer.Exit(1)
    return recordings


@app.command("worker")
def worker(
    loglevel: Annotated[str, typer.Option(help="faust/worker log level.")] = "warning",
) -> None:
    """Run the streaming worker: audio frames in; transcripts, latency and QA out (Kafka and ClickHouse)."""
    from pipeline.api.auth import check_api_settings, with_local_token
    from pipeline.api.token_file import token_path
    from pipeline.broker.security import wait_for_kafka
    from pipeline.broker.topics import check_copartitioned, ensure_topics
    from pipeline.notify.notifier import check_notify_settings
    from pipeline.worker.app import run_worker

    configured = get_settings()
    # A loopback worker without CALLQA_API_TOKEN uses (and at first makes) <state_dir>/api-token.
    settings = with_local_token(configured)
    check_api_settings(settings)  # before anything starts: an exposed /api/* is refused in one line
    check_notify_settings(settings)  # and a rule's notify: naming no webhook, or webhooks without a key
    if settings.kafka_start_wait_s:
        wait_for_kafka(settings, settings.kafka_start_wait_s,
                       lambda line: err_console.print(f"worker {settings.worker_id}: {line}", soft_wrap=True))
    ensure_topics(settings)
    check_copartitioned(settings)  # topics made elsewhere: a count that splits calls is refused in one line
    settings = _session_within_broker_bounds(settings)
    console.print(f"worker {settings.worker_id}: Kafka {settings.bootstrap}, web http://{settings.web_host}:{settings.web_port}")
    if not configured.api_token.get_secret_value().strip() and settings.api_token.get_secret_value():
        console.print(f"call pages: http://{settings.web_host}:{settings.web_port}/calls (log in with the API token "
                      f"in {token_path(settings.state_dir)}; `callqa report` reads it there)", soft_wrap=True)
    run_worker(settings, loglevel=loglevel)


@app.command("desk")
def desk(
    port: Annotated[int, typer.Option(help="Port of the desk's web server (on CALLQA_WEB_HOST).")] = 8090,
) -> None:
    """Serve the live desk (/live, /api/live/*) and the call pages from a process of its own, following the topics."""
    import asyncio

    from pipeline.api.auth import check_api_settings, with_local_token
    from pipeline.live.process import serve_desk

    settings = with_local_token(get_settings())
    check_api_settings(settings)  # the same rule as a worker's: an exposed desk needs an explicit token
    console.print(f"desk: Kafka {settings.bootstrap}, live desk http://{settings.web_host}:{port}/live", soft_wrap=True)
    asyncio.run(serve_desk(settings, port))


def _session_within_broker_bounds(settings: Settings) -> Settings:
    """The session timeout the brokers allow nearest to the setting (said in one line when it differs)."""
    from pipeline.broker.groups import fitted_session_timeout, session_timeout_bounds
    from pipeline.broker.security import ClientErrors, admin_client

    wanted = settings.kafka_session_timeout_s
    fitted = fitted_session_timeout(wanted, session_timeout_bounds(admin_client(settings, ClientErrors(settings))))
    if fitted == wanted:
        return settings
    console.print(f"CALLQA_KAFKA_SESSION_TIMEOUT_S={wanted:g} is outside what the brokers allow "
                  f"(group.min/max.session.timeout.ms): using {fitted:g} s", soft_wrap=True)
    return settings.model_copy(update={"kafka_session_timeout_s": fitted})


@app.command("report")
def report(
    call: Annotated[str | None, typer.Option("--call", help="Show one call in full: scorecard, metrics, transcript.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's calls.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only calls started since (ISO date/time, UTC).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The same rows as one JSON document on stdout (its fields: pipeline/report.py).")] = False,
    html_dir: Annotated[Path | None, typer.Option(
        "--html", help="Write the call list and each call's page as static HTML files into this folder "
                       "(index.html, calls/), as the worker serves them at /calls.")] = None,
) -> None:
    """QA report from ClickHouse (through the running worker's API when one holds the embedded store)."""
    from datetime import datetime

    from pipeline.report import print_report, read_report, source_for, write_html
    from pipeline.tables import print_json

    settings = get_settings()
    since_dt = datetime.fromisoformat(since) if since else None
    if html_dir is not None:
        index, count = write_html(source_for(settings), settings, html_dir, call_id=call, agent_id=agent,
                                  since=since_dt)
        if call and not count:
            raise RuntimeError(f"no call {call!r} in the store")
        # soft_wrap: a path is never broken across lines (a narrow or non-terminal output would cut it).
        console.print(f"{count} call page{'' if count == 1 else 's'} written: {index.resolve()}", soft_wrap=True)
        return
    from pipeline.qa.call import QaConfig

    item_ids = {q.question: q.id for q in QaConfig.from_settings(settings).scorecard.questions} if call else {}
    found = read_report(source_for(settings), settings.clickhouse_database, call_id=call, agent_id=agent,
                        since=since_dt, item_ids=item_ids)
    if call and not found.calls:
        raise RuntimeError(f"no call {call!r} in the store")
    if as_json:
        print_json(found.as_json())
    else:
        print_report(found, console)


@app.command("search")
def search_calls(
    phrase: Annotated[str, typer.Argument(help="Words to find side by side, whole, in any case, in one turn of "
                                              "the redacted transcript; \"\" for the filters alone.")],
    leg: Annotated[str | None, typer.Option(help="Only turns of this leg: agent or customer.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's calls.")] = None,
    since: Annotated[str | None, typer.Option(help="Only calls started at or after (ISO 8601, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Only calls started before (ISO 8601, UTC).")] = None,
    score_below: Annotated[float | None, typer.Option(help="Only calls whose QA score is below this (%).")] = None,
    failed: Annotated[str | None, typer.Option(help="Only calls that failed this rule (a name in rules/*.yaml).")] = None,
    category: Annotated[str | None, typer.Option(help="Only calls in this category (rules/categories/*.yaml).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many calls, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The calls as one JSON list on stdout (fields: FoundCall in pipeline/desk/search.py).")] = False,
) -> None:
    """Search the calls: a phrase in their redacted transcripts, with filters (through the running worker's API
    when one holds the embedded store, as `callqa report`)."""
    from dataclasses import asdict

    from pipeline.desk.search import SearchQuery, search
    from pipeline.qa.rules import load_rules
    from pipeline.report import source_for
    from pipeline.tables import print_json

    settings = get_settings()
    if failed is not None and failed not in (names := load_rules(settings.rules_dir).names):
        raise typer.BadParameter(f"no rule {failed!r} in {settings.rules_dir} (rules: {', '.join(sorted(names))})",
                                 param_hint="--failed")
    query = SearchQuery.from_params({"q": phrase, "leg": leg or "", "agent": agent or "", "since": since or "",
                                     "until": until or "", "failed": failed or "", "category": category or "",
                                     "score_below": "" if score_below is None else str(score_below)}, limit)
    found = search(source_for(settings), settings.clickhouse_database, query)
    if as_json:
        print_json([asdict(call) for call in found])
        return
    print_found_calls(found, query)


def print_found_calls(found: list[FoundCall], query: SearchQuery) -> None:
    from rich.markup import escape
    from rich.table import Table

    from pipeline.tables import print_table

    if not found:
        console.print("no call found")
        return
    table = Table(show_lines=bool(query.words))
    for header in ("call", "agent", "started (UTC)", "score", "turns"):
        table.add_column(header, no_wrap=header != "turns")
    for call in found:
        turns = "\n".join(f"{h.start_ms // 60000:02d}:{h.start_ms // 1000 % 60:02d} {h.leg}: {escape(h.text)}"
                          for h in call.hits)
        more = call.turns - len(call.hits)
        table.add_row(call.call_id, call.agent_id, call.started_at.strftime("%Y-%m-%d %H:%M"),
                      "-" if call.score_pct is None else f"{call.score_pct:.0f} %",
                      turns + (f"\n(+{more} more)" if more > 0 else ""))
    print_table(console, table, optional=("agent",))
    console.print(f"{len(found)} call{'' if len(found) == 1 else 's'}"
                  + (f" (the newest {query.limit}: --limit shows more)" if len(found) == query.limit else ""))


@app.command("review")
def review(
    call_id: Annotated[str, typer.Argument(help="The call to review.")],
    item: Annotated[str, typer.Option("--item", help="The scorecard item's id (rules/scorecards/*.yaml, e.g. "
                                                     "recording_disclosure).")],
    verdict: Annotated[str, typer.Option("--verdict", help="pass, fail or na (not applicable).")],
    reason: Annotated[str, typer.Option("--reason", help="Why: kept with the review.")],
    reviewer: Annotated[str, typer.Option("--reviewer", help="Who reviews (default: $USER).")] = "",
) -> None:
    """Overturn (or confirm) one scorecard item of a call: the review is kept beside the automatic verdict and
    the call is re-scored (through the running worker when one holds the embedded store)."""
    import getpass
    from urllib.parse import quote

    from pipeline.desk.review import ReviewError, submit_review
    from pipeline.qa.call import QaConfig
    from pipeline.report import WorkerApiError, running_worker
    from pipeline.store.client import connect

    settings = get_settings()
    who = reviewer or getpass.getuser()
    worker = running_worker(settings)
    if worker is not None:
        body = {"item": item, "verdict": verdict, "reason": reason, "reviewer": who}
        try:  # the worker holds the embedded store: the review goes through its API
            answer = worker.send("POST", f"/api/calls/{quote(call_id, safe='')}/reviews", body)
        except WorkerApiError as exc:
            raise ReviewError(str(exc)) from None
        score, automatic = answer["score_pct"], answer["automatic_score_pct"]
    else:
        client = connect(settings.writer_url, settings.clickhouse_database)  # the process's client: left open
        _, row = submit_review(client, settings.clickhouse_database, QaConfig.from_settings(settings).scorecard,
                               call_id, item, verdict, reason, who)
        score, automatic = row["score_pct"], row["automatic_score_pct"]
    console.print(f"{call_id}: {item} reviewed {verdict} by {who}; score {score:.0f} % (automatic {automatic:.0f} %)")


@app.command("erase")
def erase(
    call_id: Annotated[str, typer.Argument(help="The call to erase.")],
    by: Annotated[str, typer.Option("--by", help="Who erases (kept in the erasures table; default: $USER).")] = "",
    force: Annotated[bool, typer.Option("--force", help="Erase a call that has not ended (its worker may write it "
                                                        "again; the sweeper erases that too).")] = False,
) -> None:
    """Remove a call everywhere callqa keeps it: its rows in every table, its checkpoints (a tombstone), its static
    pages; record who erased it and when; say what was removed and which topics still hold it, until when."""
    import getpass

    from rich.table import Table

    from pipeline.privacy.erase import erase_call
    from pipeline.tables import print_table

    who = by or getpass.getuser()
    report = erase_call(get_settings(), call_id, who, force)
    console.print(f"call {escape(call_id)} erased by {escape(who)}"
                  + ("" if report.rows else ": no rows in the store (the erasure is on record)"))
    table = Table("table", "rows removed")
    for name, rows in sorted(report.rows.items()):
        table.add_row(name, str(rows))
    if report.rows:
        print_table(console, table)
    for line in report.outside:
        console.print(f"- {escape(line)}")


@app.command("redact")
def redact(
    since: Annotated[str | None, typer.Option(help="Only calls started since (ISO 8601, UTC unless it says "
                                                   "otherwise); default: all.")] = None,
    call: Annotated[list[str] | None, typer.Option("--call", help="A call ID to redact again (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would change; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout: the calls changed (fields: "
                                                         "CallChange in pipeline/privacy/redact.py), the errors.")] = False,
) -> None:
    """Apply the redactor again to stored calls: their transcripts, the QA text quoting them, and their kept
    recordings (what the text still held is silenced); per call what changed. Running it again changes nothing.

    Writes to CALLQA_CLICKHOUSE_URL: a server, or a stopped worker's embedded store."""
    from pipeline.privacy.redact import parse_since, print_report, redact_stored
    from pipeline.qa.call import QaConfig
    from pipeline.store.client import connect
    from pipeline.store.migrations import migrate
    from pipeline.tables import print_json

    settings = get_settings()
    moment = parse_since(since)
    config = QaConfig.from_settings(settings)
    client = connect(settings.writer_url, settings.clickhouse_database)
    migrate(client, settings.clickhouse_database)
    with Progress(TextColumn("[bold]redact[/bold]"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
                  TimeElapsedColumn(), console=err_console, transient=True,
                  disable=not err_console.is_terminal) as progress:  # a pipe gets the errors alone
        task = progress.add_task("calls", total=None)
        report = redact_stored(client, settings, config, since=moment, call_ids=call or (), dry_run=dry_run,
                               progress=lambda n, total: progress.update(task, completed=n, total=total))
    if as_json:
        print_json(report.as_json())
        for failed in report.errors:
            err_console.print(f"[red]error:[/red] {escape(failed.error)}")
    else:
        print_report(report, console, err_console)
    if report.errors:
        raise typer.Exit(1)


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="The account's name (letters, digits, . _ @ + -).")],
    role: Annotated[str, typer.Option("--role", help="admin (its tenant's calls and accounts; erases), supervisor "
                                                     "(its tenant's calls; reviews) or agent (its own calls).")],
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose calls it sees.")],
    agent_id: Annotated[str, typer.Option("--agent-id", help="An agent's id: the calls it may see.")] = "",
    password: Annotated[bool, typer.Option("--password", help="Ask for a password for the call pages' login "
                                                              "(12+ characters; kept as its scrypt hash).")] = False,
) -> None:
    """Add an account (a name is unique across tenants: one already held is refused; remove it first); its API
    token is printed on the last line, once: only its SHA-256 is kept."""
    from pipeline.access.commands import add_user

    secret = typer.prompt("password", hide_input=True, confirmation_prompt=True) if password else ""
    token = add_user(get_settings(), name, role, tenant, agent_id, secret)
    console.print(f"account {escape(name)}: {role} of tenant {escape(tenant)}"
                  + (f", agent {escape(agent_id)}" if agent_id else "") + "; its API token (shown once):")
    print(token)


@users_app.command("list")
def users_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list on stdout.")] = False,
) -> None:
    """The accounts (never their tokens)."""
    from rich.table import Table

    from pipeline.access.commands import list_users
    from pipeline.tables import print_json, print_table

    accounts = list_users(get_settings())
    if as_json:
        print_json(accounts)
        return
    table = Table("name", "role", "tenant", "agent", "created")
    for a in accounts:
        table.add_row(escape(a["name"]), a["role"], escape(a["tenant"]), escape(a["agent_id"]), str(a["created_at"]))
    print_table(console, table)


@users_app.command("remove")
def users_remove(name: Annotated[str, typer.Argument(help="The account to remove.")]) -> None:
    """Remove an account: its token stops working (on every worker within CALLQA_WEB_LOGOUT_SYNC_S)."""
    from pipeline.access.commands import remove_user

    remove_user(get_settings(), name)
    console.print(f"account {escape(name)} removed")


@app.command("calibration")
def calibration(
    since: Annotated[str | None, typer.Option(help="Only reviews made since (ISO 8601, UTC).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list on stdout (ItemCalibration's fields).")] = False,
) -> None:
    """How often reviewers overturn the machine, per scorecard item, with Cohen's kappa; most overturned first."""
    from dataclasses import asdict

    from rich.table import Table

    from pipeline.desk.calibration import read_calibration
    from pipeline.report import source_for
    from pipeline.tables import print_json, print_table

    settings = get_settings()
    items = read_calibration(source_for(settings), settings.clickhouse_database,
                             datetime.fromisoformat(since) if since else None)
    if as_json:
        print_json([{**asdict(c), "overturned_pct": c.overturned_pct} for c in items])
        return
    if not items:
        console.print("no review yet (`callqa review` or the call page's scorecard)")
        return
    table = Table("item", "reviewed", "overturned", "pass → fail", "fail → pass", "to/from n/a", "kappa",
                  title="calibration: the machine against its reviewers")
    for c in items:
        table.add_row(c.item, str(c.reviewed), f"{c.overturned} ({c.overturned_pct:.0f} %)", str(c.pass_to_fail),
                      str(c.fail_to_pass), str(c.other), "–" if c.kappa is None else f"{c.kappa:.2f}")
    print_table(console, table)


@app.command("recategorize")
def recategorize_calls(
    since: Annotated[str | None, typer.Option(help="Only calls started since (ISO 8601, UTC); default: all.")] = None,
) -> None:
    """Apply rules/categories/*.yaml again to the stored calls, from their stored QA events (no audio decoded).

    Writes to CALLQA_CLICKHOUSE_URL: a server, or a stopped worker's embedded store."""
    from collections import Counter

    from rich.progress import Progress

    from pipeline.desk.recategorize import recategorize
    from pipeline.qa.call import QaConfig
    from pipeline.store.client import connect

    settings = get_settings()
    categories = QaConfig.from_settings(settings).categories
    client = connect(settings.writer_url, settings.clickhouse_database)
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("recategorizing", total=None)
        done = recategorize(client, settings.clickhouse_database, categories,
                            datetime.fromisoformat(since) if since else None,
                            lambda n, total: progress.update(task, completed=n, total=total))
    moved = Counter(name for before, after in done.changed.values() for name in set(after) - set(before))
    left = Counter(name for before, after in done.changed.values() for name in set(before) - set(after))
    console.print(f"{done.calls} ended calls, {len(done.changed)} with new categories"
                  + "".join(f"; {name} +{moved[name]} -{left[name]}" for name in sorted(set(moved) | set(left))))


@app.command("analyze")
def analyze(
    paths: Annotated[list[Path], typer.Argument(
        help="Recordings, stereo (one leg per channel) or mono, in any format `callqa replay` reads.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object per file on stdout (its structure: pipeline/analyze.py).")] = False,
    scorecard: Annotated[Path | None, typer.Option(
        help="Scorecard YAML to score with (default: the qa_scorecard_file setting).")] = None,
    agent_channel: Annotated[str, typer.Option(
        help="Stereo: the agent's channel, left or right (the other one is the customer).")] = "left",
    mono_leg: Annotated[str, typer.Option(help="Mono: the leg the one channel is, agent or customer.")] = "agent",
    encoding: Annotated[str, typer.Option(
        help="Telephony encoding the audio goes through first, as `callqa replay` sends it: "
             "mulaw, alaw or pcm16 (16 kHz at most).")] = "mulaw",
    final_model: Annotated[str | None, typer.Option(
        help="The post-call pass: decode the segments again with this model (e.g. moonshine-base) and score "
             "QA on that transcript; default: the final_model setting (CALLQA_FINAL_MODEL), empty = none.")] = None,
) -> None:
    """Offline QA of recordings, no Kafka or store: segments, redacted transcript, rules, scorecard, alerts."""
    import asyncio
    import json

    from pipeline.analyze import AnalyzeOptions, CallAnalysis, analyze_paths, render_analysis
    from pipeline.asr.engine import Engine
    from pipeline.qa.call import QaConfig

    for name, value, allowed in (("--agent-channel", agent_channel, ("left", "right")),
                                 ("--mono-leg", mono_leg, ("agent", "customer")),
                                 ("--encoding", encoding, ("mulaw", "alaw", "pcm16"))):
        if value not in allowed:
            raise typer.BadParameter(f"{name} {value!r}: use {' or '.join(allowed)}")
    settings = get_settings()
    if scorecard is not None:
        settings = settings.model_copy(update={"qa_scorecard_file": str(scorecard)})
    config = QaConfig.from_settings(settings)  # a bad rule or scorecard stops here, before the model loads
    options = AnalyzeOptions(encoding=encoding, agent_channel=agent_channel, mono_leg=mono_leg)  # type: ignore[arg-type]

    def emit(analysis: CallAnalysis) -> None:
        if as_json:
            print(json.dumps(analysis.as_json(), ensure_ascii=False), flush=True)
        else:
            render_analysis(analysis, console)

    engine = Engine.load(settings=settings)
    # The setting names no pass when it is the live model (Settings.post_call_model); an explicit --final-model runs.
    final_name = settings.post_call_model if final_model is None else final_model
    final_engine = Engine.load(final_name, settings=settings) if final_name else None
    if asyncio.run(analyze_paths(paths, engine, config, options, emit, err_console, final_engine)):
        raise typer.Exit(1)


@app.command("retranscribe")
def retranscribe(
    recordings: Annotated[Path | None, typer.Option(
        help="The contact center's recordings: one file per call, named by call ID (<call id>.wav, .flac, ...).")] = None,
    audio_topic: Annotated[bool, typer.Option(
        "--audio-topic", help="Take each call's audio from the audio topic instead (it keeps 6 h).")] = False,
    since: Annotated[datetime | None, typer.Option(
        help="Calls started at or after this time (ISO 8601, UTC unless it says otherwise).")] = None,
    call: Annotated[list[str] | None, typer.Option("--call", help="A call ID to redo (repeatable).")] = None,
    model: Annotated[str | None, typer.Option(
        help="The accurate model (default: the final_model setting, CALLQA_FINAL_MODEL).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document: the changes and the calls skipped.")] = False,
) -> None:
    """The post-call pass over stored calls: each one's recording transcribed again by the accurate model, QA
    scored on it and stored as the call's next revision; prints what changed against the previous one."""
    import json

    from pipeline.asr.engine import Engine
    from pipeline.contracts import Serde
    from pipeline.qa.call import QaConfig
    from pipeline.retranscribe import AudioTopic, run
    from pipeline.store.client import connect
    from pipeline.store.migrations import migrate
    from pipeline.tables import keep_whole, print_table

    settings = get_settings()
    name = model or settings.final_model
    if not name:
        raise typer.BadParameter("no model: pass --model or set CALLQA_FINAL_MODEL (e.g. moonshine-base)")
    if (recordings is None) == (not audio_topic):
        raise typer.BadParameter("say where the audio is: --recordings DIR or --audio-topic (one of them)")
    if recordings is not None and not recordings.is_dir():
        raise typer.BadParameter(f"--recordings {recordings}: not a folder")
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    config = QaConfig.from_settings(settings)
    client = connect(settings.writer_url, settings.clickhouse_database)
    migrate(client, settings.clickhouse_database)
    with err_console.status(f"transcribing again with {name}..."):
        source = recordings if recordings is not None else AudioTopic(settings, Serde.from_settings(
            settings.schema_registry_url))
        changes, skipped = run(client, source, Engine.load(name, settings=settings), config, since=since,
                               call_ids=call or ())
    if as_json:
        print(json.dumps({"changes": [c.as_json() for c in changes],
                          "skipped": [{"call_id": s.call_id, "why": s.why} for s in skipped]}))
        return
    table = Table("call", "revision", "score", "auto-fail", "items changed", title=f"retranscribed with {name}")
    for c in changes:
        before = "-" if c.score_before is None else f"{c.score_before:.1f}"
        items = "; ".join(f"{q}: {b} → {a}" for q, (b, a) in c.items_changed.items()) or "none"
        table.add_row(c.call_id, str(c.revision), f"{before} → {c.score_after:.1f}",
                      f"{c.auto_failed_before} → {c.auto_failed_after}", items)
    print_table(console, keep_whole(table, "call", "revision", "score", "auto-fail"))
    for s in skipped:
        err_console.print(f"skipped {s.call_id}: {s.why}")


@app.command("settings")
def show_settings(
    as_json: Annotated[bool, typer.Option(
        "--json", help='The same rows as a JSON list on stdout: {"setting", "env", "value", "default", '
                       '"description"}, values as JSON (secrets masked).')] = False,
) -> None:
    """Every setting: env var, current value, default and what it does."""
    from pydantic_core import to_jsonable_python

    from pipeline.tables import keep_whole, print_json, print_table

    settings = get_settings()
    if as_json:
        values = settings.model_dump(mode="json")  # a SecretStr dumps as "**********"
        print_json([{"setting": name, "env": env, "value": values[name], "default": to_jsonable_python(field.default),
                     "description": field.description or ""}
                    for (name, field), (env, *_) in zip(Settings.model_fields.items(), settings.describe(), strict=True)])
        return
    table = keep_whole(Table("env var", "value", "default", "description"), "env var", "value", "default")
    for row in settings.describe():
        table.add_row(*(escape(cell) for cell in row))
    print_table(console, table, optional=("default",))


def _register_optional_commands() -> None:
    """Commands of parts that live in their own packages."""
    try:
        from pipeline.asr.cli import models_app, transcribe
    except ImportError:
        return
    app.add_typer(models_app, name="models")
    app.command("transcribe")(transcribe)


_register_optional_commands()


def _describe_validation(exc: pydantic.ValidationError) -> str:
    """``CALLQA_FIELD: message`` per error, on one line; the inputs are left out (they may be secrets)."""
    parts = []
    for error in exc.errors(include_input=False, include_url=False):
        field = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"CALLQA_{field.upper()}: {message}" if field else message)
    return "; ".join(parts)


VERBOSE = ("--verbose", "-v")


def _invoke(args: list[str]) -> Any:
    """Run the command line. ``--verbose`` is the root's option; given after a sub-command that has none of
    its own (`callqa bench gateway --verbose`), it means the same there, not "No such option"."""
    try:
        return app(args=args, prog_name="callqa", standalone_mode=False)
    except TyperException as exc:
        if getattr(exc, "option_name", None) not in VERBOSE:
            raise
        return app(args=["--verbose", *(a for a in args if a not in VERBOSE)], prog_name="callqa", standalone_mode=False)


def _usage_error(exc: TyperException) -> str:
    format_message = getattr(exc, "format_message", None)
    message = format_message() if callable(format_message) else str(exc)
    command = getattr(getattr(exc, "ctx", None), "command_path", "") or "callqa"
    return f"{message}  (`{command} --help` lists the options)"


def main() -> None:
    began = time.monotonic()
    try:
        # Outside standalone mode click returns a command's `typer.Exit(code)` instead of exiting with it.
        exit_code = _invoke(sys.argv[1:])
        if isinstance(exit_code, int) and exit_code:
            sys.exit(exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    # Usage errors (a bad option or value): one line naming it and the command's --help, exit status 2 as
    # click gives them; a traceback would say nothing more. Typer carries its own copy of click, so
    # `except click.ClickException` never matched them: they printed as failures, exit 1, with a
    # "--verbose for details" hint.
    except TyperException as exc:
        err_console.print(f"[red]error:[/red] {escape(_usage_error(exc))}")
        sys.exit(getattr(exc, "exit_code", 2))
    except pydantic.ValidationError as exc:  # bad settings: which ones and why, never the values given
        err_console.print(f"[red]error:[/red] invalid settings: {escape(_describe_validation(exc))}")
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the CLI's one place that turns errors into one line
        if _state["verbose"]:
            err_console.print_exception()
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # --verbose is the root command's option: the hint gives the command again with it where it works.
        again = "" if _state["verbose"] else f"; `{shlex.join(['callqa', '--verbose', *sys.argv[1:]])}` for details"
        err_console.print(f"[red]error:[/red] {msg}  [dim](after {time.monotonic() - began:.1f} s{escape(again)})[/dim]")
        sys.exit(1)


if __name__ == "__main__":
    main()
