"""A small HTTP forwarder for the storage service's presigned URLs that can hold back uploads.

Started before the platform (whose ``HM_STORAGE_PUBLIC_URL`` then points at it), told its upstream
afterwards (``hypermedia up`` picks the storage HTTP port at start). Every request is forwarded
as is, except that a ``PUT`` whose path starts with ``hold_prefix`` is read completely, announced
(:attr:`DelayingProxy.held`) and kept until :attr:`DelayingProxy.release` is set (or
``max_hold_seconds`` passed) before it goes upstream.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@dataclass(frozen=True)
class Forwarded:
    """One request the proxy answered: method, path with query, the status sent back, and whether
    it was held back."""

    method: str
    path: str
    status: int
    held: bool


class DelayingProxy:
    """A threaded HTTP/1.1 forwarder on a free port of 127.0.0.1. Use as a context manager."""

    def __init__(self, hold_prefix: str, max_hold_seconds: float = 30.0) -> None:
        self.hold_prefix = hold_prefix
        self.max_hold_seconds = max_hold_seconds
        self.held = threading.Event()
        """Set when the first request to hold has arrived in full (and is being held)."""
        self.release = threading.Event()
        """Set by the test to let held requests go upstream."""
        self.held_paths: list[str] = []
        self.forwarded: list[Forwarded] = []
        self._upstream: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="delayproxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def set_upstream(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.hostname and parts.port, url
        self._upstream = (parts.hostname, parts.port)

    def record(self, entry: Forwarded) -> None:
        with self._lock:
            self.forwarded.append(entry)

    def __enter__(self) -> DelayingProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _handler(proxy: DelayingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP and name.lower() not in ("date", "server"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self) -> None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self._reply(501, [], b"chunked request bodies are not supported by this proxy")
                self.close_connection = True
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            held = self.command == "PUT" and self.path.startswith(proxy.hold_prefix)
            if held:
                proxy.held_paths.append(self.path)
                proxy.held.set()
                proxy.release.wait(proxy.max_hold_seconds)
            if proxy._upstream is None:
                self._reply(503, [], b"no upstream yet")
                proxy.record(Forwarded(self.command, self.path, 503, held))
                return
            host, port = proxy._upstream
            conn = http.client.HTTPConnection(host, port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self._reply(response.status, response.getheaders(), data)
                proxy.record(Forwarded(self.command, self.path, response.status, held))
            finally:
                conn.close()

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

    return Handler
