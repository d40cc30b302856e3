"""The SIPREC server's sockets: SIP over UDP and TCP on ``--sip-port``, over TLS on ``--sips-port``, and one
UDP socket per recorded stream for its RTP. Everything else is ``recorder.RecordingServer``.

A message that does not parse is answered 400 when it names enough to be answered (Via, From, To,
Call-ID, CSeq), else dropped; either way it is counted and the server goes on. A TCP/TLS connection
whose framing breaks (no Content-Length, an oversized message) is closed: a byte stream cannot find its
next message boundary again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, cast

from pipeline.gateway.siprec.message import SipError, StreamFramer, parse, response
from pipeline.gateway.siprec.recorder import REFUSAL_LOG_S, Outgoing, Peer, RecordingServer, Transport

log = logging.getLogger("callqa.gateway.siprec")
TICK_S = 0.02  # the jitter buffers' release granularity (their packets wait at most siprec_jitter_wait_ms)


OnRtp = Callable[[tuple[str, int], bytes, tuple[str, int]], None]


class RtpEndpoint(asyncio.DatagramProtocol):
    def __init__(self, on_rtp: OnRtp, key: tuple[str, int]) -> None:
        self.on_rtp = on_rtp
        self.key = key

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.on_rtp(self.key, data, (str(addr[0]), int(addr[1])))


class UdpMediaPorts:
    """``MediaPorts`` on real sockets: bound at once (the SDP answer names the port), registered with the
    loop right after; datagrams that arrive in between wait in the socket's buffer."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.on_rtp: OnRtp = lambda key, data, source: None
        self._transports: dict[tuple[str, int], asyncio.BaseTransport | None] = {}
        self._sockets: dict[tuple[str, int], socket.socket] = {}

    def open(self, key: tuple[str, int]) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)  # a burst after a stall
        sock.bind((self.host, 0))
        sock.setblocking(False)
        self._sockets[key] = sock
        self._transports[key] = None
        asyncio.get_running_loop().create_task(self._register(key, sock))
        port: int = sock.getsockname()[1]
        return port

    async def _register(self, key: tuple[str, int], sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: RtpEndpoint(self.on_rtp, key), sock=sock)
        if key in self._transports and self._sockets.get(key) is sock:
            self._transports[key] = transport
        else:  # closed before it was registered
            transport.close()

    def close(self, key: tuple[str, int]) -> None:
        transport = self._transports.pop(key, None)
        sock = self._sockets.pop(key, None)
        if transport is not None:
            transport.close()
        elif sock is not None:
            sock.close()

    def close_all(self) -> None:
        for key in list(self._sockets):
            self.close(key)


class SipDatagrams(asyncio.DatagramProtocol):
    def __init__(self, shell: SipListener) -> None:
        self.shell = shell

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.shell.udp = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if data.strip() == b"":  # keep-alive (RFC 5626 CRLF) or an empty datagram
            return
        self.shell.received(data, Peer("udp", str(addr[0]), int(addr[1])), stream=False)


class SipListener:
    """The sockets of one recording server, and its tick."""

    def __init__(self, server: RecordingServer, media: UdpMediaPorts) -> None:
        self.server = server
        self.media = media
        media.on_rtp = server.on_rtp
        self.udp: asyncio.DatagramTransport | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._next_connection = 0
        self._ticker: asyncio.Task[None] | None = None
        self._malformed_logged = (-REFUSAL_LOG_S, 0)  # (last logged, malformed since): a flood logs a line a while

    async def start(self, host: str, port: int, tls_port: int | None = None,
                    tls: ssl.SSLContext | None = None) -> tuple[int, int | None]:
        """Listen (UDP and TCP on ``port``, TLS on ``tls_port``); returns the ports bound (0 picks free
        ones: UDP and TCP then share the one UDP got)."""
        bound = await self._listen_udp_and_tcp(host, port)
        tls_bound = None
        if tls_port is not None:
            if tls is None:
                raise ValueError("--sips-port needs CALLQA_GATEWAY_TLS_CERT and CALLQA_GATEWAY_TLS_KEY")
            secure = await asyncio.start_server(lambda r, w: self._connection(r, w, "tls"), host, tls_port, ssl=tls)
            self._servers.append(secure)
            tls_bound = int(secure.sockets[0].getsockname()[1])
        self._ticker = asyncio.create_task(self._tick())
        return bound, tls_bound

    async def _listen_udp_and_tcp(self, host: str, port: int, tries: int = 20) -> int:
        """UDP and TCP on one port. With port 0 the UDP socket's free port may be taken for TCP (another
        connection's local port): then another one is tried."""
        loop = asyncio.get_running_loop()
        for attempt in range(tries):
            udp, _ = await loop.create_datagram_endpoint(lambda: SipDatagrams(self), local_addr=(host, port))
            bound = int(udp.get_extra_info("sockname")[1])
            try:
                tcp = await asyncio.start_server(lambda r, w: self._connection(r, w, "tcp"), host, bound)
            except OSError:
                udp.close()
                if port != 0 or attempt == tries - 1:
                    raise
                continue
            self._servers.append(tcp)
            return bound
        raise AssertionError("unreachable")

    def received(self, data: bytes, peer: Peer, stream: bool) -> None:
        try:
            msg = parse(data, stream=stream)
        except SipError as err:
            self._malformed(err, peer)
            return
        try:
            self.send(self.server.on_message(msg, peer))
        except Exception:  # a bug in one request's handling must not stop the server
            log.exception("SIPREC %s from %s:%d failed; answered 500", msg.method or msg.status, peer.host, peer.port)
            if msg.is_request and msg.method != "ACK":
                self.send([Outgoing(response(msg, 500).to_bytes(), peer)])

    def _malformed(self, err: SipError, peer: Peer) -> None:
        answerable = err.partial is not None and err.partial.method != "ACK"
        self.server.metrics.malformed.labels("answered" if answerable else "dropped").inc()
        now = self.server.clock()
        last, unlogged = self._malformed_logged
        if now - last >= REFUSAL_LOG_S:
            self._malformed_logged = (now, 0)
            more = f" (and {unlogged} more malformed since the last line)" if unlogged else ""
            log.warning("SIPREC malformed message from %s:%d (%s): %s%s", peer.host, peer.port,
                        "answered" if answerable else "dropped", err.detail[:200], more)
        else:
            self._malformed_logged = (last, unlogged + 1)
        if answerable and err.partial is not None:
            warning = ("warning", f'399 callqa "{err.detail[:100].replace(chr(34), chr(39))}"')
            self.send([Outgoing(response(err.partial, err.status, headers=[warning]).to_bytes(), peer)])

    def send(self, outgoing: list[Outgoing]) -> None:
        for out in outgoing:
            if out.peer.transport == "udp":
                if self.udp is not None:
                    self.udp.sendto(out.data, (out.peer.host, out.peer.port))
            else:
                writer = self._writers.get(out.peer.connection)
                if writer is not None and not writer.is_closing():
                    writer.write(out.data)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: Transport) -> None:
        self._next_connection += 1
        connection = self._next_connection
        self._writers[connection] = writer
        host, port = writer.get_extra_info("peername")[:2]
        peer = Peer(kind, str(host), int(port), connection)
        framer = StreamFramer()
        try:
            while data := await reader.read(65536):
                for message in framer.feed(data):
                    self.received(message, peer, stream=True)
        except SipError as err:
            self.server.metrics.malformed.labels("connection_closed").inc()
            log.warning("SIPREC %s connection from %s:%d closed: %s", kind, host, port, err.detail)
        except (ConnectionError, ssl.SSLError) as exc:
            log.info("SIPREC %s connection from %s:%d: %s", kind, host, port, exc)
        finally:
            self._writers.pop(connection, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.send(self.server.tick())
            except Exception:  # a bug here must not stop every later session from ending
                log.exception("SIPREC timer failed; it goes on")

    async def shutdown(self) -> None:
        """A BYE to every SRC, every session ended, the sockets closed."""
        self.send(self.server.shutdown())
        await asyncio.sleep(0.05)  # let the BYEs leave
        if self._ticker is not None:
            self._ticker.cancel()
        for server in self._servers:
            server.close()
        for writer in list(self._writers.values()):
            writer.close()
        if self.udp is not None:
            self.udp.close()
        self.media.close_all()
