"""``callqa desk``: the live desk in a process of its own, beside the workers, none of whose work it touches.

It serves what a worker's web port serves to people (the call pages and ``/api/*`` on the store, and the live
desk on the topics) with the same settings, token and accounts, so several may run behind a load balancer;
it follows the topics from its start to its end (a worker's desk only while someone looks). Its reads of the
store go through the same read-only pool: with the embedded store (chdb) that means a store of its own path,
whose accounts are its own; a deployment shares a ClickHouse server between workers and desks.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, cast

import faust
from aiohttp import web as aioweb

from pipeline.api.auth import ApiAuth, auth_middleware
from pipeline.api.limits import SourceLimit, request_size_middleware, source_limit_middleware
from pipeline.api.pool import QueryPool
from pipeline.api.server import register_api_views
from pipeline.config import Settings
from pipeline.live.desk import LiveDesk
from pipeline.live.views import register_live_views
from pipeline.web.views import register_web_views

log = logging.getLogger("callqa.desk")


def build_desk(settings: Settings) -> tuple[aioweb.Application, LiveDesk, QueryPool]:
    """The desk's web application (faust's web layer, never started as a faust worker: no consumer, no
    group), its live desk and its read pool."""
    auth = ApiAuth.from_settings(settings)
    app = faust.App(f"{settings.worker_id}-desk", web_enabled=True, web_application_options={
        "client_max_size": settings.api_max_request_bytes, "middlewares": [
            request_size_middleware(settings.api_max_request_bytes, auth.refusals),
            source_limit_middleware(SourceLimit(settings.api_source_max_concurrent), auth.refusals),
            auth_middleware(auth)]})
    pool = QueryPool(settings.api_query_threads, settings.api_query_max_waiting)
    server = register_api_views(app, settings, pool, auth)
    register_web_views(server)
    desk = LiveDesk(settings, always=True)
    register_live_views(server, desk)

    @app.page("/health")
    async def health(web: Any, request: Any) -> Any:
        board = desk.board
        return web.json({"status": "ok" if board.ready else "starting", "calls": len(board.calls)},
                        status=200 if board.ready else 503)

    return cast(Any, app.web).web_app, desk, pool  # faust's aiohttp driver's application


async def serve_desk(settings: Settings, port: int, started: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT; then streams end at once (browsers reconnect to another desk)."""
    web_app, desk, pool = build_desk(settings)
    runner = aioweb.AppRunner(web_app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = aioweb.TCPSite(runner, settings.web_host, port)
    await site.start()
    desk.touch()  # follow the topics from now on, asked or not
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        await desk.close()
        await runner.cleanup()
        pool.shutdown()
