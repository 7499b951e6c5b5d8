"""The worker's side of the same-host hand-off (ADR 0045, :mod:`services.storage.handoff`): a
presigned GET URL of the local store traded on a Unix socket for a read-only file descriptor of
the object, which the kernel copies into the job's ``input/`` (``sendfile(2)``): no HTTP, no bytes
through Python. Anything but a descriptor (no socket, refused, an old storage) and the caller
falls back to HTTP, which then answers with the authoritative error."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from hypermedia.core.errors import PermanentJobError, TransientError

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 5.0
"""Connect, request and answer on the socket (seconds); the copy itself is not bounded by it."""
COPY_CHUNK_BYTES = 1 << 30
"""Bytes per ``sendfile`` call (the kernel caps one call at 2 GiB − 4 KiB anyway)."""


class Handoff:
    """Trades presigned GET URLs for file descriptors on ``path``.

    Args:
        path: the storage service's hand-off socket (``HM_STORAGE_HANDOFF_SOCKET``).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._warned = False

    async def fetch(self, url: str, dest: Path, max_bytes: int) -> bool:
        """Copy the object of ``url`` into ``dest`` through a descriptor; False when the socket
        gave none (the caller then uses HTTP). ``dest`` is created or truncated only on success
        of the exchange.

        Raises:
            PermanentJobError: ``INPUT_TOO_LARGE`` when the object is larger than ``max_bytes``.
            TransientError: ``STORAGE_UNAVAILABLE`` when the file ended before its size (it
                changed while copied).
        """
        parts = urlsplit(url)
        request = f"{parts.path}?{parts.query}\n".encode()
        try:
            reply, fd = await asyncio.to_thread(self._exchange, request)
        except OSError as exc:
            if not self._warned:
                log.warning(
                    "storage hand-off unavailable at %s (%s): originals come over HTTP", self._path, exc
                )
                self._warned = True
            return False
        if fd is None:
            return False
        try:
            size = int(reply["size"])
            if size > max_bytes:
                raise PermanentJobError("the input exceeds the profile's size limit", "INPUT_TOO_LARGE")
            await asyncio.to_thread(_copy, fd, dest, size)
        finally:
            os.close(fd)
        return True

    def _exchange(self, request: bytes) -> tuple[dict, int | None]:
        """One request, one JSON answer and at most one descriptor (a 200 answer's)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_SECONDS)
            sock.connect(self._path)
            sock.sendall(request)
            data, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
        try:
            reply = json.loads(data)
        except ValueError:
            reply = {}
        if not isinstance(reply, dict) or reply.get("status") != 200 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return reply if isinstance(reply, dict) else {}, None
        return reply, fds[0]


def _copy(fd: int, dest: Path, size: int) -> None:
    """``size`` bytes of ``fd`` from offset 0 into ``dest`` by ``sendfile(2)``."""
    with dest.open("wb") as out:
        offset = 0
        while offset < size:
            sent = os.sendfile(out.fileno(), fd, offset, min(size - offset, COPY_CHUNK_BYTES))
            if sent == 0:
                raise TransientError("the original changed while it was copied", "STORAGE_UNAVAILABLE")
            offset += sent
