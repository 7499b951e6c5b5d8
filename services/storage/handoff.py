"""Same-host hand-off of originals: a worker on the local store's machine presents a presigned GET
URL on a Unix socket and receives an open, read-only file descriptor of the object instead of its
bytes over HTTP (ADR 0045).

Protocol, one exchange per connection: the client sends the URL's path and query
(``/o/{key}?expires=…&sig=…[&ct=…]``, at most :data:`MAX_REQUEST_BYTES`, ending in ``\\n``); the
server checks it exactly as the HTTP ``GET`` does (:meth:`LocalStore.verify`) and answers one JSON
line, ``{"status": 200, "size": N}`` with the descriptor attached (``SCM_RIGHTS``, unix(7)), or
``{"status": 400|403|404, "error_code": "…", "detail": "…"}`` without one. The signature stays the
only authority: being able to connect grants nothing, as with the HTTP port. S3 has no such path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from services.storage.backends import is_valid_key
from services.storage.localstore import LocalStore

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
"""Longest request line accepted (bytes); a presigned path is a few hundred."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""How long a connection may take to send its whole request line (seconds), however it drips."""
MAX_EXCHANGES = 64
"""Exchanges served at once; a connection beyond them is closed at once (a worker falls back to
HTTP). A presigned path arrives in one packet, so a legitimate exchange takes a millisecond."""


def answer(store: LocalStore, request: bytes) -> tuple[dict[str, Any], int | None]:
    """The answer to one request line and the descriptor to attach (``None`` on refusal).

    Args:
        store: the local store whose signatures and files are used.
        request: the URL's path and query, as sent (trailing newline allowed).

    Returns:
        ``({"status": 200, "size": bytes}, fd)``, the fd opened ``O_RDONLY | O_NOFOLLOW``
        (the caller closes it after sending); or ``({"status", "error_code", "detail"}, None)``:
        400 ``INVALID_KEY``, 403 ``URL_REJECTED``, 404 ``NOT_FOUND``.
    """
    try:
        parts = urlsplit(request.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return _refused(400, "INVALID_KEY", "the request is not a presigned GET path"), None
    key = unquote(parts.path.removeprefix("/o/")) if parts.path.startswith("/o/") else ""
    if not is_valid_key(key):
        return _refused(400, "INVALID_KEY", "invalid object key"), None
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    if not store.verify("GET", key, query.get("expires", ""), query.get("sig", ""), query.get("ct", "")):
        return _refused(403, "URL_REJECTED", "the URL is expired or its signature does not match"), None
    try:
        fd = os.open(store.path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # missing, a directory, a symlink (ELOOP): nothing the store wrote
        return _refused(404, "NOT_FOUND", "no such object"), None
    return {"status": 200, "size": os.fstat(fd).st_size}, fd


def _refused(status: int, error_code: str, detail: str) -> dict[str, Any]:
    return {"status": status, "error_code": error_code, "detail": detail}


class HandoffServer:
    """The Unix socket server of :mod:`services.storage.handoff`: the standard library's threading
    Unix stream server, one short-lived thread per exchange, beside the event loop.

    Args:
        store: the local store.
        path: the socket's path; a stale socket there is replaced. Mode 0660: the worker must run
            as the storage service's user or group (``hypermedia up`` runs both as one user).
    """

    def __init__(self, store: LocalStore, path: Path) -> None:
        self._store = store
        self._path = path
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen. Raises OSError when the path cannot be bound."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if self._path.is_socket():
                self._path.unlink()
        store = self._store

        class Exchange(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                _exchange(store, self.request)

        server = _BoundedServer(str(self._path), Exchange)
        os.chmod(self._path, 0o660)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="storage-handoff", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop listening (exchanges under way finish) and remove the socket."""
        if self._server is not None:
            await asyncio.to_thread(self._server.shutdown)
            self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()


class _BoundedServer(socketserver.ThreadingUnixStreamServer):
    """A thread per exchange, at most :data:`MAX_EXCHANGES` at once: one more connection is
    closed before any thread is started for it, and the first of such refusals a minute is logged."""

    daemon_threads = True

    def __init__(self, path: str, handler: type[socketserver.BaseRequestHandler]) -> None:
        super().__init__(path, handler)
        self._slots = threading.BoundedSemaphore(MAX_EXCHANGES)
        self._warned_at = -60.0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            if time.monotonic() - self._warned_at >= 60:
                self._warned_at = time.monotonic()
                log.warning("storage hand-off: %d exchanges at once, closing new connections", MAX_EXCHANGES)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _exchange(store: LocalStore, sock: socket.socket) -> None:
    """One request line in (within :data:`REQUEST_TIMEOUT_SECONDS` in all), one JSON line out with
    the descriptor attached (``sendmsg``)."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_SECONDS
    fd: int | None = None
    try:
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return  # a drip: the whole line was not there in time
            sock.settimeout(left)
            chunk = sock.recv(MAX_REQUEST_BYTES)
            if not chunk or len(line) + len(chunk) > MAX_REQUEST_BYTES:
                return  # the client went away or sent more than a presigned path
            line += chunk
        reply, fd = answer(store, line)
        sock.settimeout(REQUEST_TIMEOUT_SECONDS)
        socket.send_fds(sock, [(json.dumps(reply) + "\n").encode()], [] if fd is None else [fd])
    except OSError:
        pass  # timed out or reset: the client retries or falls back to HTTP
    finally:
        if fd is not None:
            os.close(fd)
