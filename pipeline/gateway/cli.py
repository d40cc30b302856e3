"""`callqa gateway`: the live telephony gateway (Twilio Media Streams, Genesys AudioHook) into Kafka."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

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
    host: Annotated[str, typer.Option(help="Interface to listen on (streams without credentials only on loopback).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    loglevel: Annotated[str, typer.Option(help="Log level of the gateway (debug, info, warning, error).")] = "info",
) -> None:
    """Serve /twilio and /audiohook (websockets), /healthz and /metrics until SIGTERM or Ctrl-C, which
    drain open calls (each gets its end event) before exiting."""
    if ctx.invoked_subcommand is not None:
        return
    from pipeline.broker.producer import ContractProducer
    from pipeline.broker.topics import ensure_topics
    from pipeline.config import get_settings
    from pipeline.contracts import Serde

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    ensure_topics(settings)
    producer = ContractProducer.from_settings(settings, Serde.from_settings(settings.schema_registry_url))
    asyncio.run(_serve(settings, host, port, producer))


async def _serve(settings: Settings, host: str, port: int, producer: ContractProducer) -> None:
    from pipeline.gateway.server import GatewayServer

    server = GatewayServer(settings, producer)
    bound = await server.start(host, port)
    scheme = "wss" if server.tls is not None else "ws"
    console.print(f"gateway on {scheme}://{host}:{bound}: /twilio, /audiohook; /healthz, /metrics "
                  f"(Kafka {settings.bootstrap})")
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
    if not settings.twilio_auth_token.get_secret_value():
        console.print("[yellow]CALLQA_TWILIO_AUTH_TOKEN is not set: /twilio takes unsigned streams on loopback "
                      "and refuses every stream on other interfaces[/yellow]")
    if not settings.audiohook_api_key.get_secret_value():
        console.print("[yellow]CALLQA_AUDIOHOOK_API_KEY is not set: /audiohook takes any key on loopback "
                      "and refuses every session on other interfaces[/yellow]")
