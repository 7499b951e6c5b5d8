"""Virus scanning of uploads by a ClamAV daemon (clamd), over its ``INSTREAM`` command.

The protocol (clamd(8), section COMMANDS; ClamAV documentation, "Usage > Scanning > clamd"):

- One command per connection, over a unix socket or TCP. A command prefixed with ``z`` ends with a
  NUL byte, and so does clamd's reply.
- ``zPING\\0`` → ``PONG\\0``.
- ``zINSTREAM\\0``, then the data in chunks, each a 4-byte unsigned big-endian length followed by
  that many bytes, then a zero-length chunk. The reply is ``stream: OK\\0``,
  ``stream: <signature> FOUND\\0``, or ``<reason> ERROR\\0``. Past clamd's ``StreamMaxLength``
  (clamd.conf(5); 100M when unset, Debian's file sets 25M) clamd answers ``INSTREAM size limit
  exceeded. ERROR`` and closes the connection, possibly while the client is still sending.

Why not a library (PyPI, November 2026): ``clamd`` (last release 2014) and ``pyClamd`` (2017) are
unmaintained and blocking; ``clamdpy`` and ``clamav-client`` (GPL-2.0) are blocking; ``aioclamd``
1.1.0 is asyncio and MIT but speaks TCP only (no unix socket) and is untyped; ``Pyvalve`` is
GPL-3.0, pulls in three packages and its ``timeout`` only bounds an SSL handshake. The part of the
protocol needed here, ``PING`` and ``INSTREAM``, is a few dozen lines.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace

from hypermedia.core.errors import InvalidArgument, PayloadTooLarge, TransientError

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

CHUNK_BYTES = 64 * 1024
"""Size of the INSTREAM chunks sent to clamd (bytes)."""
MAX_REPLY_BYTES = 64 * 1024
"""Longest reply read from clamd (bytes); a reply is one short line."""

_FOUND = re.compile(r"^stream: (?P<signature>.+) FOUND$")
_SIZE_LIMIT_REPLY = "INSTREAM size limit exceeded. ERROR"


class VirusFound(InvalidArgument):
    """clamd found a signature in the content (HTTP 422, ``VIRUS_FOUND``). ``signature`` is the name
    clamd reported, such as ``Win.Test.EICAR_HDB-1``; it is also in the public message."""

    default_code = "VIRUS_FOUND"

    def __init__(self, signature: str) -> None:
        super().__init__(f"the file was rejected by the virus scanner: {signature}", "VIRUS_FOUND")
        self.signature = signature

    @property
    def details(self) -> dict[str, str]:
        return {"signature": self.signature}


class ScannerUnavailable(TransientError):
    """clamd could not be reached, did not answer within the timeout, or answered with an error or
    something unexpected (HTTP 503, ``SCANNER_UNAVAILABLE``). The content was not scanned."""

    default_code = "SCANNER_UNAVAILABLE"


class TooLargeToScan(PayloadTooLarge):
    """The content is larger than the client's ``max_stream_bytes`` or clamd's ``StreamMaxLength``
    (HTTP 413, ``INPUT_TOO_LARGE_TO_SCAN``). The content was not scanned."""

    default_code = "INPUT_TOO_LARGE_TO_SCAN"


@dataclass(frozen=True)
class ClamdAddress:
    """Where clamd listens: a unix socket path, or a TCP host and port."""

    unix_path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, url: str) -> ClamdAddress:
        """``unix:///run/clamav/clamd.ctl`` or ``tcp://host:3310`` (``tcp://[::1]:3310``).

        Raises:
            ValueError: any other form. The message names ``HM_CLAMD_URL`` and not the value.
        """
        parts = urlsplit(url)
        if parts.scheme == "unix" and not parts.netloc and parts.path.startswith("/"):
            return cls(unix_path=parts.path)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme == "tcp" and parts.hostname and port and parts.path in ("", "/"):
            return cls(host=parts.hostname, port=port)
        raise ValueError("HM_CLAMD_URL must be unix:///absolute/path or tcp://host:port")

    def __str__(self) -> str:
        return f"unix://{self.unix_path}" if self.unix_path else f"tcp://{self.host}:{self.port}"


@dataclass(frozen=True)
class ScanResult:
    """clamd's verdict: ``signature`` is the name of what it found, ``None`` when clean."""

    signature: str | None

    @property
    def infected(self) -> bool:
        return self.signature is not None


class ClamdScanner:
    """An asyncio client of one clamd: a new connection per command, each bounded by a timeout.

    Args:
        address: where clamd listens.
        timeout_seconds: the longest one command may take, connecting, sending and the reply
            included.
        max_stream_bytes: content larger than this is refused without contacting clamd; keep it
            at most clamd's ``StreamMaxLength``.
    """

    def __init__(self, address: ClamdAddress, *, timeout_seconds: float, max_stream_bytes: int) -> None:
        self.address = address
        self._timeout = timeout_seconds
        self.max_stream_bytes = max_stream_bytes

    async def ping(self, timeout_seconds: float = 2.0) -> bool:
        """True when clamd answers ``PONG`` within ``timeout_seconds`` (at most the scan timeout);
        never raises. For readiness checks."""
        try:
            return await self._command(b"PING", b"", min(timeout_seconds, self._timeout)) == "PONG"
        except ScannerUnavailable:
            return False

    async def scan(self, content: bytes) -> ScanResult:
        """Scan ``content`` with ``INSTREAM``.

        Raises:
            TooLargeToScan: above ``max_stream_bytes``, or clamd's ``StreamMaxLength``.
            ScannerUnavailable: clamd unreachable, too slow, or answering ``… ERROR`` or anything
                other than ``stream: OK`` / ``stream: <signature> FOUND``.
        """
        if len(content) > self.max_stream_bytes:
            raise TooLargeToScan(
                f"files are limited to {self.max_stream_bytes} bytes while virus scanning is on"
            )
        with _tracer.start_as_current_span("clamd.instream", attributes={"size_bytes": len(content)}) as span:
            reply = await self._command(b"INSTREAM", content, self._timeout)
            span.set_attribute("reply", reply[:200])
        if reply == "stream: OK":
            return ScanResult(None)
        if found := _FOUND.match(reply):
            return ScanResult(found["signature"])
        if reply == _SIZE_LIMIT_REPLY:
            log.error(
                "clamd refused %d bytes: its StreamMaxLength is below HM_CLAMD_MAX_STREAM_BYTES", len(content)
            )
            raise TooLargeToScan("the file is larger than the virus scanner accepts")
        log.error("clamd at %s answered %r", self.address, reply[:200])
        raise ScannerUnavailable("the virus scanner could not scan the file", "SCANNER_UNAVAILABLE")

    async def ensure_clean(self, content: bytes) -> None:
        """Scan ``content`` and log the verdict; raise :class:`VirusFound` when clamd found something.

        Raises:
            VirusFound, TooLargeToScan, ScannerUnavailable: see :meth:`scan`.
        """
        started = time.monotonic()
        result = await self.scan(content)
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        if result.signature is not None:
            log.warning(
                "virus scan: %s FOUND in %d bytes",
                result.signature,
                len(content),
                extra={"signature": result.signature, "size_bytes": len(content), "duration_ms": elapsed_ms},
            )
            raise VirusFound(result.signature)
        log.info(
            "virus scan: clean, %d bytes",
            len(content),
            extra={"size_bytes": len(content), "duration_ms": elapsed_ms},
        )

    async def _command(self, command: bytes, stream: bytes, timeout: float) -> str:
        """Send ``z<command>\\0`` (and ``stream`` in INSTREAM chunks when ``command`` is INSTREAM);
        return clamd's reply without its NUL. Raises ScannerUnavailable.

        Plain non-blocking sockets rather than asyncio streams: when clamd closes the connection
        in the middle of a stream (StreamMaxLength), a stream transport drops the reply that is
        already waiting to be read; a socket still reads it."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                sock = await self._connect()
                try:
                    await loop.sock_sendall(sock, b"z" + command + b"\0")
                    if command == b"INSTREAM":
                        await _send_chunks(sock, memoryview(stream))
                    reply = await _read_reply(sock)
                finally:
                    sock.close()
        except TimeoutError:
            log.error("clamd at %s did not answer %s within %.1f s", self.address, command.decode(), timeout)
            raise ScannerUnavailable(
                "the virus scanner did not answer in time", "SCANNER_UNAVAILABLE"
            ) from None
        except OSError as exc:
            log.error("clamd at %s unreachable: %s: %s", self.address, type(exc).__name__, exc)
            raise ScannerUnavailable("the virus scanner is unavailable", "SCANNER_UNAVAILABLE") from None
        return reply.decode("utf-8", "replace").strip()

    async def _connect(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        target: str | tuple[Any, ...]
        if self.address.unix_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target = self.address.unix_path
        else:
            infos = await loop.getaddrinfo(self.address.host, self.address.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, target = infos[0]
            sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, target)
        except BaseException:
            sock.close()
            raise
        return sock


async def _send_chunks(sock: socket.socket, data: memoryview) -> None:
    """INSTREAM's body: length-prefixed chunks and the zero-length terminator. clamd closes the
    connection early when the stream passes StreamMaxLength, and its reply, read next, says so:
    a broken pipe here is not an error of its own."""
    loop = asyncio.get_running_loop()
    try:
        for start in range(0, len(data), CHUNK_BYTES):
            chunk = data[start : start + CHUNK_BYTES]
            await loop.sock_sendall(sock, len(chunk).to_bytes(4, "big"))
            await loop.sock_sendall(sock, chunk)
        await loop.sock_sendall(sock, b"\0\0\0\0")
    except (BrokenPipeError, ConnectionResetError):
        pass


async def _read_reply(sock: socket.socket) -> bytes:
    """clamd's reply up to its NUL (or up to the end of the connection), at most
    :data:`MAX_REPLY_BYTES`. Raises ConnectionError when nothing came before the end."""
    loop = asyncio.get_running_loop()
    reply = b""
    while b"\0" not in reply and len(reply) < MAX_REPLY_BYTES:
        try:
            data = await loop.sock_recv(sock, 4096)
        except ConnectionResetError:
            data = b""
        if not data:
            break
        reply += data
    if not reply:
        raise ConnectionError("clamd closed the connection without a reply")
    return reply.split(b"\0", 1)[0]
