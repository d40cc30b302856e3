"""The live desk on an API server: ``/api/live/calls`` (the calls in progress, JSON), ``/api/live/calls/{id}``
(one with its turns and alerts so far), ``/api/live/events`` and ``/live/events`` (Server-Sent Events), and the
pages ``/live`` and ``/live/{id}``. Plugged into the ``ApiServer`` as the call pages are: the same auth middleware
(bearer token under /api, the page login elsewhere: a browser's EventSource sends the session cookie), the
same scopes (a call outside the viewer's is unknown: 404, and never in a stream or snapshot).

A stream starts with a ``snapshot`` event (the calls in progress, or the one call) unless its
``Last-Event-ID`` (header, or ``last_event_id`` in the query for clients that cannot set it) names an event
this desk still has: then it resumes with the events after it, none missed, none twice. Then ``call``,
``turn``, ``alert`` and ``ended`` events as they come (a stream of all calls carries ``call``, ``alert`` and
``ended`` unless ``kinds`` asks for more; a stream of one call, ``?call=ID``, carries all four); a comment
every ``live_heartbeat_s`` when nothing happens; it ends after ``live_stream_max_s``, or when the process
stops, and the client reconnects with the id of the last event it got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web as aioweb

from pipeline.access.users import Principal
from pipeline.api.auth import principal_of
from pipeline.api.server import ApiServer
from pipeline.live.board import LiveBoard, LiveEvent
from pipeline.live.desk import LiveDesk
from pipeline.web.live import LIVE_CSP, render_live_call, render_live_wall
from pipeline.web.render import PageContext, ServerLinks, render_message

log = logging.getLogger("callqa.live")
KINDS = frozenset({"call", "turn", "alert", "ended"})
WALL_KINDS = frozenset({"call", "alert", "ended"})
# How long a request waits for a desk that just started to have read the calls in progress.
READY_WAIT_S = 10.0


def register_live_views(server: ApiServer, desk: LiveDesk) -> None:
    app, settings = server.app, server.settings
    context = PageContext(ServerLinks(), logged_in=server.auth.mode == "token")
    headers = {"Content-Security-Policy": LIVE_CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}

    async def board() -> LiveBoard:
        current = desk.touch()
        deadline = time.monotonic() + READY_WAIT_S
        while not current.ready and not current.closed and time.monotonic() < deadline:
            await current.wait(current.seq, 0.2)
        return current

    @app.page("/api/live/calls")
    async def calls_view(web: Any, request: Any) -> Any:
        b = await board()
        return web.json({"calls": b.snapshot(principal_of(request)), "ready": b.ready,
                         "last_event_id": b.event_id(b.seq)})

    @app.page("/api/live/calls/{call_id}")
    async def call_view(web: Any, request: Any, call_id: str) -> Any:
        view = (await board()).call(call_id, principal_of(request))
        if view is None:
            return web.json({"error": f"no call {call_id} in progress"}, status=404)
        return web.json(view)

    async def events_view(web: Any, request: Any) -> Any:
        return await _stream(request, desk, await board(), settings.live_heartbeat_s, settings.live_stream_max_s,
                             settings.live_max_streams, settings.live_source_max_streams)

    app.page("/api/live/events")(events_view)
    app.page("/live/events")(events_view)

    @app.page("/live")
    async def wall_page(web: Any, request: Any) -> Any:
        b = await board()
        body = render_live_wall(b.snapshot(principal_of(request)), context, request.query.get("sort", "longest"),
                                b.ready)
        return aioweb.Response(text=body, content_type="text/html", headers=headers)

    @app.page("/live/{call_id}")
    async def call_page(web: Any, request: Any, call_id: str) -> Any:
        view = (await board()).call(call_id, principal_of(request))
        if view is None:  # unknown here, or outside the viewer's scope: the same answer
            body = render_message("No such call", f"No call {call_id} is in progress here.", context.links,
                                  context.logged_in)
            return aioweb.Response(text=body, status=404, content_type="text/html", headers=headers)
        return aioweb.Response(text=render_live_call(call_id, view, context), content_type="text/html",
                               headers=headers)


async def _stream(request: Any, desk: LiveDesk, board: LiveBoard, heartbeat_s: float, max_s: float,
                  max_streams: int, per_source: int) -> aioweb.StreamResponse:
    who = principal_of(request)
    call_id = request.query.get("call") or None
    kinds = _kinds(request.query.get("kinds"), call_id)
    if kinds is None:
        return aioweb.json_response({"error": f"kinds: a comma-separated list of {', '.join(sorted(KINDS))}"},
                                    status=400)
    if call_id is not None and board.call(call_id, who) is None:
        return aioweb.json_response({"error": f"no call {call_id} in progress"}, status=404)
    if desk.streams >= max_streams:
        return aioweb.json_response({"error": "too many live streams open; try again shortly"}, status=503,
                                    headers={"Retry-After": "5"})
    source = request.remote or "unknown"
    if desk.streams_by_source[source] >= per_source:
        return aioweb.json_response({"error": f"too many live streams open from {source} ({per_source}, "
                                              "CALLQA_LIVE_SOURCE_MAX_STREAMS)"}, status=429,
                                    headers={"Retry-After": "5"})
    response = aioweb.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                              "X-Accel-Buffering": "no"})
    desk.streams += 1
    desk.streams_by_source[source] += 1
    try:
        await response.prepare(request)
        last = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
        seq = board.seq
        events = board.events_after(last, who, call_id)
        if events is None:
            await _send(response, board.event_id(seq), "snapshot", _snapshot(board, who, call_id))
        else:
            await _send_events(response, board, events, kinds)
        ends = time.monotonic() + max_s
        while not board.closed and time.monotonic() < ends:
            await board.wait(seq, min(heartbeat_s, max(0.0, ends - time.monotonic())))
            if board.seq == seq:
                await response.write(b": keep-alive\n\n")
                continue
            events = board.events_after(board.event_id(seq), who, call_id)
            seq = board.seq
            if events is None:  # more than the buffer holds came since: start over
                await _send(response, board.event_id(seq), "snapshot", _snapshot(board, who, call_id))
            else:
                await _send_events(response, board, events, kinds)
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client went away: nothing to finish
    finally:
        desk.streams -= 1
        desk.streams_by_source[source] -= 1
        if desk.streams_by_source[source] <= 0:
            del desk.streams_by_source[source]
    return response


def _kinds(asked: str | None, call_id: str | None) -> frozenset[str] | None:
    if asked is None:
        return KINDS if call_id is not None else WALL_KINDS
    kinds = frozenset(k.strip() for k in asked.split(",") if k.strip())
    return kinds if kinds and kinds <= KINDS else None


def _snapshot(board: LiveBoard, who: Principal, call_id: str | None) -> dict[str, Any]:
    if call_id is None:
        return {"calls": board.snapshot(who)}
    return board.call(call_id, who) or {"ended": True, "page": f"/calls/{call_id}"}


async def _send_events(response: aioweb.StreamResponse, board: LiveBoard, events: list[LiveEvent],
                       kinds: frozenset[str]) -> None:
    for event in events:
        if event.kind in kinds:
            await _send(response, board.event_id(event.seq), event.kind, event.data)


async def _send(response: aioweb.StreamResponse, event_id: str, kind: str, data: dict[str, Any]) -> None:
    await response.write(f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
                         .encode())
