"""`callqa gateway`: the live telephony gateway (Twilio Media Streams, Genesys AudioHook) into Kafka."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import uvloop
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from pipeline.broker.producer import ContractProducer
    from pipeline.config import Settings

gateway_app = typer.Typer(
    short_help="Live telephony gateway: Twilio Media Streams and Genesys AudioHook into Kafka.",
    help=__doc__, invoke_without_command=True)
console = Console()


@gateway_app.callback()
def gateway(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Interface to listen on (CALLQA_GATEWAY_AUTH=off only on loopback).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    loglevel: Annotated[str, typer.Option(help="Log level of the gateway (debug, info, warning, error).")] = "info",
    sip_port: Annotated[int | None, typer.Option(help="Also serve SIPREC (RFC 7866) on this port, SIP over UDP and "
                                                      "TCP, for SBCs and PBXs (CALLQA_SIPREC_* settings).")] = None,
    sips_port: Annotated[int | None, typer.Option(help="SIPREC over TLS on this port (the certificate of "
                                                       "CALLQA_GATEWAY_TLS_CERT/_KEY); needs --sip-port.")] = None,
) -> None:
    """Serve /twilio and /audiohook (websockets) and /healthz, and /metrics on the metrics port, until SIGTERM or Ctrl-C, which
    drain open calls (each gets its end event) before exiting."""
    if ctx.invoked_subcommand is not None:
        return
    from pipeline.broker.producer import ContractProducer
    from pipeline.broker.security import wait_for_kafka
    from pipeline.broker.topics import ensure_topics
    from pipeline.config import get_settings
    from pipeline.contracts import Serde

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    if settings.kafka_start_wait_s:
        wait_for_kafka(settings, settings.kafka_start_wait_s, logging.getLogger(__name__).warning)
    ensure_topics(settings)
    # Delivery reports for failures only: a report per acknowledged frame was a Python callback for each
    # of 50 frames a second per leg; flush() still waits for every acknowledgement.
    producer = ContractProducer.from_settings(settings, Serde.from_settings(settings.schema_registry_url),
                                              **{"delivery.report.only.error": True})
    # The sender thread needs the GIL a few times per batch; a busy event loop gives it up only every
    # switch interval (5 ms by default), which the frames waiting for that batch's acks paid for.
    sys.setswitchinterval(0.001)
    from pipeline.gateway.server import GatewayConfigError

    try:
        if sips_port is not None and sip_port is None:
            raise GatewayConfigError("--sips-port needs --sip-port")
        uvloop.run(_serve(settings, host, port, producer, sip_port, sips_port))  # libuv's loop: less CPU per websocket message
    except GatewayConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


async def _serve(settings: Settings, host: str, port: int, producer: ContractProducer, sip_port: int | None,
                 sips_port: int | None) -> None:
    from pipeline.gateway.server import GatewayServer

    server = GatewayServer(settings, producer)
    bound = await server.start(host, port)
    scheme = "wss" if server.tls is not None else "ws"
    console.print(f"gateway on {scheme}://{host}:{bound}: /twilio, /audiohook, /healthz; /metrics and secure pause "
                  f"(POST /calls/<id>/pause|resume) on http://{settings.gateway_metrics_host}:{server.metrics_port} "
                  f"(Kafka {settings.bootstrap})")
    if sip_port is not None:
        sip, sips = await server.start_siprec(host, sip_port, sips_port)
        console.print(f"SIPREC on sip:{host}:{sip} (UDP, TCP)" + (f", sips:{host}:{sips} (TLS)" if sips else ""))
    _warn_open_paths(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    console.print(f"draining {len(server.sessions)} sessions and {len(server.calls.calls)} calls "
                  f"(up to {settings.gateway_drain_s:.0f} s)")
    await server.shutdown()
    m = server.metrics
    console.print(f"gateway stopped: {m.value('callqa_gateway_frames_acknowledged_total'):,.0f} frames acknowledged, "
                  f"{m.value('callqa_gateway_frames_dropped_total'):,.0f} dropped")


def _warn_open_paths(settings: Settings) -> None:
    open_or_shut = "takes unauthenticated streams (CALLQA_GATEWAY_AUTH=off)" if settings.gateway_auth == "off" \
        else "refuses every stream"
    if not settings.twilio_auth_token.get_secret_value():
        console.print(f"[yellow]CALLQA_TWILIO_AUTH_TOKEN is not set: /twilio {open_or_shut}[/yellow]")
    if not settings.audiohook_api_key.get_secret_value():
        console.print(f"[yellow]CALLQA_AUDIOHOOK_API_KEY is not set: /audiohook {open_or_shut}[/yellow]")


@gateway_app.command("simulate")
def simulate_command(
    files: Annotated[list[Path], typer.Argument(help="Recordings, one call each (stereo: left agent, right "
                                                     "customer; mono: the agent).", exists=True, dir_okay=False)],
    protocol: Annotated[str, typer.Option(help="twilio (Media Streams), audiohook (Genesys AudioHook v2) or siprec "
                                               "(RFC 7866, as an SBC records).")] = "twilio",
    calls: Annotated[int, typer.Option(help="Concurrent calls (0: one per file; more reuse the files in turn).")]
    = 0,
    realtime: Annotated[bool, typer.Option("--realtime/--fast", help="Pace at 20 ms, or as fast as the gateway "
                                                                      "takes it (a gateway whose "
                                                                      "CALLQA_GATEWAY_SESSION_MESSAGES_PER_S "
                                                                      "is 0: its default closes such a "
                                                                      "stream; SIPREC: 8x real time).")] = True,
    url: Annotated[str | None, typer.Option(help="The gateway (ws:// or wss://; a bare host:port gets "
                                                 "/twilio/<callSid> or /audiohook), default ws://127.0.0.1:8765; "
                                                 "SIPREC: sip:HOST:PORT[;transport=tcp], default "
                                                 "sip:127.0.0.1:5060.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Tracebacks on errors.")] = False,
) -> None:
    """Send recordings to a gateway as live calls, signed with the secrets the gateway checks
    (CALLQA_TWILIO_AUTH_TOKEN; CALLQA_AUDIOHOOK_API_KEY, CALLQA_AUDIOHOOK_CLIENT_SECRET; SIPREC: the first
    user of CALLQA_SIPREC_USERS); prints the call IDs (Twilio callSid, AudioHook conversationId, SIP Call-ID)."""
    from pipeline.audio.files import AudioFileError
    from pipeline.config import get_settings
    from pipeline.gateway.simulate import (
        SimulationError,
        options_from_settings,
        recordings_of,
        run_with_progress,
    )

    if protocol not in ("twilio", "audiohook", "siprec"):
        raise typer.BadParameter("--protocol is twilio, audiohook or siprec")
    if calls < 0:
        raise typer.BadParameter("--calls must be >= 0")
    try:
        recordings = recordings_of(files)
        url = url or ("sip:127.0.0.1:5060" if protocol == "siprec" else "ws://127.0.0.1:8765")
        options = options_from_settings(get_settings(), protocol, url, calls, realtime)  # type: ignore[arg-type]
        report = run_with_progress(recordings, options, console)
    except (SimulationError, AudioFileError) as exc:
        if verbose:
            raise
        console.print(f"[red]simulate: {exc}[/red]")
        raise typer.Exit(1) from None
    for call_id in report.call_ids:
        console.print(call_id)


# `callqa pause` / `callqa resume` (registered by pipeline/cli.py): the secure pause of a call (pause.py).
def _secure_pause(action: str, call_id: str, urls: list[str] | None) -> None:
    from pipeline.config import get_settings
    from pipeline.gateway.pause import request

    answer = request(get_settings(), call_id, "pause" if action == "pause" else "resume", urls or None)
    body = answer.body
    if action == "pause":
        console.print(f"call {escape(call_id)} paused at {body.get('paused_at_ms', 0) / 1000:.1f} s of the call by "
                      f"{escape(answer.url)}: its audio is dropped there until `callqa resume {escape(call_id)}`",
                      soft_wrap=True)
    else:
        console.print(f"call {escape(call_id)} resumed at {body.get('resumed_at_ms', 0) / 1000:.1f} s of the call "
                      f"by {escape(answer.url)}, after {body.get('paused_ms', 0) / 1000:.1f} s paused", soft_wrap=True)


GATEWAY_URLS = typer.Option("--url", help="A gateway's operators' listener (http://host:port) to ask; repeat for "
                                          "several. Default: CALLQA_GATEWAY_CONTROL_URLS, else this host's.")


def pause_call(call_id: Annotated[str, typer.Argument(help="The call (Twilio CallSid, AudioHook conversationId, "
                                                           "SIP Call-ID).")],
               url: Annotated[list[str] | None, GATEWAY_URLS] = None) -> None:
    """Secure pause: the gateway holding the call stops capturing it (its audio is dropped there, never sent)
    until `callqa resume`, or the call's end; the call's events say when, and QA leaves the span out."""
    _secure_pause("pause", call_id, url)


def resume_call(call_id: Annotated[str, typer.Argument(help="The paused call.")],
                url: Annotated[list[str] | None, GATEWAY_URLS] = None) -> None:
    """End a secure pause: the gateway holding the call captures its audio again."""
    _secure_pause("resume", call_id, url)
