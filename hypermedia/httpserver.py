"""An HTTP server (uvicorn) run inside a service's own event loop.

The service owns signal handling (SIGTERM starts its ordered shutdown), so uvicorn's own signal
capture is switched off; the socket is bound at construction so a bind error surfaces as OSError
there and port 0 is known before the app is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import uvicorn

HTTP_MAX_CONCURRENCY = 256
"""Connections served at once; beyond this uvicorn answers 503."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service's main owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpServer:
    """uvicorn serving an ASGI app inside the caller's event loop, on a socket bound at construction
    (so a bind error is an ``OSError`` here, and port 0 is known before the app is built).

    Args:
        host, port: address to listen on; port 0 picks a free port (see :attr:`port`).
        grace_seconds: how long :meth:`stop` waits for in-flight requests.
    """

    def __init__(self, host: str, port: int, grace_seconds: float = 10.0) -> None:
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
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, app: Any) -> None:
        """Serve ``app`` until :meth:`stop`; returns once the server accepts connections."""
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # uvicorn's own handlers print plain text; ours write JSON lines
            access_log=False,
            lifespan="off",
            limit_concurrency=HTTP_MAX_CONCURRENCY,
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
