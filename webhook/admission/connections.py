"""Held connections, bounded in number, time and memory.

A connection costs memory for as long as it is open (asyncio's TLS read buffer alone was 256 KiB),
so a client that keeps many open could take the process past its memory limit: after one complete
``GET /healthz`` each, 1,800 connections trickling a second request's headers a byte every 5 s took
it from 85 to 598 MB, and the memory stayed after they closed. So, per listening port:

- every request's headers must be complete within ``header_timeout`` of its first byte (the first
  request's, of the connection's start); a keep-alive connection idle for ``idle_timeout`` (no
  byte of a next request) is closed. The idle timeout is longer than the API server's own (Go's
  ``IdleConnTimeout``, 90 s) so that the API server closes first: a close racing its next request
  would fail that admission;
- at most ``per_address`` connections per client address and ``per_listener`` in all, counted
  from the moment the connection is accepted (TLS handshakes included). At a limit a connection
  is cut to make room, never one whose request is being handled: at the address's limit its
  least recently active one, at the listener's one of the address that holds the most (so a
  flood from a few addresses cannot lock out the API server, which needs few). When every
  connection is handling a request, the new one is closed unanswered;
- each connection's memory is bounded: a 16 KiB TLS read buffer (one TLS record; asyncio's
  default is 256 KiB), request headers of at most MAX_HEADERS fields of MAX_FIELD_BYTES;
- the memory that closed connections held goes back to the operating system
  (:func:`return_freed_memory`): freed C buffers otherwise stay in the allocator's heap.

TLS is started here (asyncio's own server-side TLS transport, given our read buffer size) after
the limits have admitted the connection, so a refused one costs no handshake.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .config import ConnectionLimits

MAX_LINE_BYTES = 4096  # the request line (the API server's is "POST /validate?timeout=10s HTTP/1.1")
MAX_FIELD_BYTES = 4096  # one header field
MAX_HEADERS = 32  # the API server sends about ten
TLS_READ_BUFFER = 16 * 1024  # one TLS record's plaintext
TLS_SHUTDOWN_TIMEOUT = 3.0  # waiting for a peer's close_notify (asyncio's default: 30 s)


class _TlsProtocol(sslproto.SSLProtocol):
    """asyncio's server-side TLS, reading at most one TLS record at a time: its 256 KiB default
    read buffer is allocated (and touched) for every connection."""

    max_size = TLS_READ_BUFFER


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler with a deadline on every request's headers, not only the
    first's: aiohttp has no header timeout of its own (its keep-alive timeout closes a connection
    that has not completed a request only after ``keepalive_timeout``)."""

    __slots__ = ("_header_timeout", "_header_timer", "_on_lost", "_on_overdue", "address", "active_at")

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, address: str, header_timeout: float,
                 on_lost: Callable[[GuardedHandler], None], on_overdue: Callable[[], None], **options: Any):
        super().__init__(manager, loop=loop, **options)
        self.address = address
        self.active_at = loop.time()
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._on_lost, self._on_overdue = on_lost, on_overdue

    @property
    def busy(self) -> bool:
        """A request of this connection is being handled, or waits to be: such a connection is
        never cut to make room (idle ones, those still sending headers and handshakes may be)."""
        return self._request_in_progress or bool(self._messages)

    def _waiting(self) -> bool:
        """Between requests: none queued, none being handled (aiohttp waits on ``_waiter`` then)."""
        return self._waiter is not None and not self._waiter.done()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_header_clock()  # the first request's headers

    def data_received(self, data: bytes) -> None:
        begins = self._waiting() and bool(data)  # bytes of a next request (a body's come while it is handled)
        count = self._request_count
        super().data_received(data)
        self.active_at = self._loop.time()
        if self._request_count != count:  # its headers are complete
            self._stop_header_clock()
        elif begins and self._header_timer is None:
            self._start_header_clock()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        super().connection_lost(exc)
        self._on_lost(self)

    def _start_header_clock(self) -> None:
        self._header_timer = self._loop.call_later(self._header_timeout, self._headers_overdue, self._request_count)

    def _stop_header_clock(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_overdue(self, count: int) -> None:
        self._header_timer = None
        if self._request_count == count and self.transport is not None:
            self.transport.abort()  # not close(): a TLS shutdown would wait for the slow client again
            self._on_overdue()


class _Accepted(asyncio.Protocol):
    """A TCP connection just accepted: handed to :meth:`Listener.accept`, which replaces this
    protocol (with TLS, then HTTP) or closes the connection."""

    def __init__(self, listener: Listener):
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.listener.accept(transport)  # type: ignore[arg-type]


Closed = Callable[[str], None]  # told why the listener closed a connection: refused, cut, header-timeout


class Listener:
    """The connections of one listening port: ``loop.create_server(listener.protocol, ...)``
    (without ``ssl=``: TLS starts in :meth:`accept`). ``handler_options`` are aiohttp
    RequestHandler options (access_log, auto_decompress); the header bounds and the keep-alive
    timeout are set here. ``name`` names the port (admission, probe); ``closed_by_us`` hears of each
    connection closed to keep the bounds (the server's metric)."""

    def __init__(self, server: web.Server, context: ssl.SSLContext | None, limits: ConnectionLimits, name: str,
                 closed_by_us: Closed = lambda reason: None, **handler_options: Any):
        self.server, self.context, self.limits, self.name = server, context, limits, name
        self.closed_by_us = closed_by_us
        self.handler_options = {**handler_options, "keepalive_timeout": limits.idle_timeout,
                                "max_line_size": MAX_LINE_BYTES, "max_field_size": MAX_FIELD_BYTES,
                                "max_headers": MAX_HEADERS}
        self._open: set[GuardedHandler] = set()
        self._by_address: dict[str, set[GuardedHandler]] = {}
        self._handshaking: dict[GuardedHandler, asyncio.Transport] = {}  # before TLS hands them to the handler
        self.closed = 0  # connections ended so far (for return_freed_memory)
        self.refused = 0  # at a cap, with none that could be cut
        self.evicted = 0  # cut to make room

    def protocol(self) -> asyncio.Protocol:
        return _Accepted(self)

    @property
    def open(self) -> int:
        return len(self._open)

    def accept(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._room(address):
            self.refused += 1
            self.closed_by_us("refused")
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        handler = GuardedHandler(self.server, loop=loop, address=address, header_timeout=self.limits.header_timeout,
                                 on_lost=self._release, on_overdue=lambda: self.closed_by_us("header-timeout"),
                                 **self.handler_options)
        self._open.add(handler)
        self._by_address.setdefault(address, set()).add(handler)
        if self.context is None:
            transport.set_protocol(handler)
            handler.connection_made(transport)
            return
        self._handshaking[handler] = transport
        handshake: asyncio.Future[None] = loop.create_future()
        handshake.add_done_callback(lambda done: self._handshake_done(handler, done))
        tls = _TlsProtocol(loop, handler, self.context, handshake, server_side=True,
                           ssl_handshake_timeout=self.limits.handshake_timeout,
                           ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT)
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_done(self, handler: GuardedHandler, done: asyncio.Future[None]) -> None:
        """The handshake ended; unless it handed the connection to ``handler`` (which then reports
        its end), nothing else will say that this connection is gone."""
        self._handshaking.pop(handler, None)
        failed = done.cancelled() or done.exception() is not None
        if failed or handler.transport is None:
            self._release(handler)

    def _room(self, address: str) -> bool:
        """Whether a new connection from ``address`` fits, after cutting one if needed."""
        peers = self._by_address.get(address, set())
        if len(peers) >= self.limits.per_address and not self._evict(peers):
            return False
        return len(self._open) < self.limits.per_listener or self._evict(self._open)

    def _evict(self, candidates: set[GuardedHandler]) -> bool:
        """Cut the connection not handling a request whose address holds the most connections,
        the least recently active of them; False when every candidate is handling one."""
        free = [handler for handler in candidates if not handler.busy]
        if not free:
            return False
        victim = max(free, key=lambda handler: (len(self._by_address[handler.address]), -handler.active_at))
        transport = self._handshaking.get(victim) or victim.transport
        self._release(victim)
        self.evicted += 1
        self.closed_by_us("cut")
        if transport is not None:
            transport.abort()
        return True

    def _release(self, handler: GuardedHandler) -> None:
        if handler not in self._open:
            return
        self._open.discard(handler)
        peers = self._by_address.get(handler.address)
        if peers is not None:
            peers.discard(handler)
            if not peers:
                del self._by_address[handler.address]
        self.closed += 1

    def close(self) -> None:
        """Abort the handshakes still under way (a stopping server serves no new connection)."""
        for transport in list(self._handshaking.values()):
            transport.abort()


_libc: Any = None


def return_freed_memory() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc's ``malloc_trim``): the
    buffers of closed connections are freed but stay in the heap, between blocks still in use,
    so the process keeps their memory. False where the C library has no malloc_trim (musl)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True
