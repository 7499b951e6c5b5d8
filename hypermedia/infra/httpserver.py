"""An HTTP server (uvicorn) run inside a service's own event loop, with bounds on what one
connection may hold.

The service owns signal handling (SIGTERM starts its ordered shutdown), so uvicorn's own signal
capture is switched off; the socket is bound at construction so a bind error surfaces as OSError
there and port 0 is known before the app is built.

uvicorn bounds none of this by itself: it starts no timer before a connection's first byte, has
no limit on a request head's size or header count with httptools, and its ``limit_concurrency``
answers 503 to every request once that many connections are open, so a few hundred connections
that send nothing took the gateway and the storage service down (issue 14).
:class:`~hypermedia.infra.httpprotocol.GuardedHttpProtocol`, uvicorn's httptools protocol with a
:class:`~hypermedia.infra.httpguard.ConnectionGuard` shared by
the connections of one server, adds the limits of :class:`~hypermedia.infra.httplimits.HttpSettings`
(ADR 0028):

- a deadline for each request head (from the connect, or from the end of the previous response),
  an idle deadline between body pieces while the app reads and a minimum average body rate (as
  Apache's mod_reqtimeout ``MinRate``), and for a response the client keeps the server waiting
  on, an idle deadline and a minimum average rate at which it must take it;
- a cap on open connections per client address and per server, where a new connection is
  admitted and evicts a connection that is not serving a request (lingering, then silent and
  never served, then idle after a served request; oldest first) instead of being refused, so a
  flood of idle connections only replaces itself and cannot keep real requests out; when every
  connection is serving, a small reserve over the cap answers the server's health paths;
- bounds on the request head (bytes, header fields, request target): ``431`` / ``414``;
- a lingering close after an answer sent before the request was read, so the answer is read by the
  client instead of being destroyed by the reset a close with unread input sends.

Refusals written by the protocol itself are ``application/problem+json`` like the apps' errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from typing import Any

import uvicorn

from hypermedia.infra.httpguard import DEFAULT_LIMITS, ConnectionGuard
from hypermedia.infra.httplimits import HttpSettings
from hypermedia.infra.httpprotocol import guarded_protocol

log = logging.getLogger(__name__)

FD_HEADROOM = 256
"""File descriptors kept for everything but HTTP connections (database pool, gRPC, NATS, files):
the soft ``RLIMIT_NOFILE`` is raised, up to the hard limit, to ``max_connections`` plus this."""


def ensure_descriptors(connections: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` (up to the hard limit) so ``connections`` connections plus
    :data:`FD_HEADROOM` descriptors fit, as Go's runtime does at start. Returns the soft limit
    after; logs a warning when the hard limit is too low (connections past it fail to be
    accepted: asyncio then pauses accepting for a second)."""
    need = connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "RLIMIT_NOFILE is %d: below HM_HTTP_MAX_CONNECTIONS (%d) plus %d; raise the hard limit",
            soft,
            connections,
            FD_HEADROOM,
        )
    return soft


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service's main owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpServer:
    """uvicorn serving an ASGI app inside the caller's event loop, on a socket bound at construction
    (so a bind error is an ``OSError`` here, and port 0 is known before the app is built), with the
    connection limits of :class:`GuardedHttpProtocol`.

    Args:
        host, port: address to listen on; port 0 picks a free port (see :attr:`port`).
        grace_seconds: how long :meth:`stop` waits for in-flight requests.
        limits: deadlines and caps per connection (default: :data:`DEFAULT_LIMITS`; services pass
            ``load(HttpSettings)``, the ``HM_HTTP_*`` variables).
        reserve_paths: paths a connection over the cap may still ``GET`` while every connection
            is serving (``{"/healthz", "/readyz"}``; see :class:`ConnectionGuard`); none by default.
    """

    def __init__(
        self,
        host: str,
        port: int,
        grace_seconds: float = 10.0,
        limits: HttpSettings = DEFAULT_LIMITS,
        reserve_paths: frozenset[str] = frozenset(),
    ) -> None:
        # IPPROTO_TCP explicitly: asyncio enables TCP_NODELAY on accepted connections only when the
        # listening socket says so; with protocol 0 every response waited ~40 ms for the client's
        # delayed ACK (Nagle). Measured in bench/job_overhead.py: REST GET 56.6 → 15.6 ms p50.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._grace = grace_seconds
        self.guard = ConnectionGuard(limits, reserve_paths)
        """This server's connections (for tests and diagnostics: ``open``, ``closed``)."""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, app: Any) -> None:
        """Serve ``app`` until :meth:`stop`; returns once the server accepts connections."""
        limits = self.guard.limits
        ensure_descriptors(
            limits.max_connections + (limits.reserve_connections if self.guard.reserve_paths else 0)
        )
        config = uvicorn.Config(
            app,
            http=guarded_protocol(self.guard),
            ws="none",  # no app here speaks WebSocket; an upgrade would leave the guard's limits
            log_level="warning",
            log_config=None,  # uvicorn's own handlers print plain text; ours write JSON lines
            access_log=False,
            lifespan="off",
            limit_concurrency=None,  # the guard caps connections; uvicorn's cap answered 503 to all
            timeout_graceful_shutdown=int(self._grace),
            server_header=False,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="http-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("HTTP server exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, wait up to the grace period for in-flight requests, close the socket."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._sock.close()
