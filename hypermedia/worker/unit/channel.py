"""Control's end of the unit socket (seed 001, ADR 0046): who may talk on it and what is refused.

Shape::

    connect ─▶ at most MAX_CONNECTIONS open (more: closed at once, counted)
            ─▶ hello within HELLO_SECONDS, of the current identity, from execution's own pid
               (SO_PEERCRED) ─▶ evidence back; this connection is execution's
            ─▶ ready / status / media_request / media_release (only after that hello)

Every refusal (malformed, oversized, stale, out of order, from another pid, too many connections,
no hello in time) is counted in :attr:`Channel.refused` and logged, at most one line per kind each
:data:`LOG_EVERY_SECONDS`, so a flood of bad connections cannot flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from hypermedia.sandbox import cgroups
from hypermedia.worker.unit import peer
from hypermedia.worker.unit.coordinator import MediaCoordinator, Request, TooManyRequests

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4
"""Connections open on the socket at once. Execution needs one; a relaunch briefly overlaps the
old generation's closing one."""

HELLO_SECONDS = 5.0
"""How long a new connection has to say hello before control closes it."""

LOG_EVERY_SECONDS = 10.0
"""At most one log line per kind of refusal this often (the count keeps every one)."""


@dataclass
class Execution:
    """One launch of execution: its process, cgroup, identity and what it told control."""

    identity: peer.UnitIdentity
    process: subprocess.Popen[bytes]
    group: cgroups.JobCgroup | None
    launched_at: float
    worker_ids: tuple[str, ...]
    """The worker id of each of its lanes (one per queue), whose jobs containment hands back."""
    exit_code: int | None = None
    writer: asyncio.StreamWriter | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    status: dict[str, Any] = field(default_factory=dict)
    status_at: float = 0.0
    """``time.monotonic()`` of the last status (0: none yet)."""
    silent: bool = False
    """Contained because it fell silent (no status for ``HM_UNIT_STATUS_SILENCE_SECONDS``)."""

    def busy_on(self, queue: str, slots: int) -> int:
        """The jobs running on ``queue`` by the last status (its ``queues``; a status without
        them gives its ``busy``), within ``0..slots``."""
        lanes = self.status.get("queues")
        lane = lanes.get(queue) if isinstance(lanes, dict) else None
        value = lane.get("busy", 0) if isinstance(lane, dict) else self.status.get("busy", 0)
        try:
            return min(slots, max(0, int(value)))
        except (TypeError, ValueError, OverflowError):
            return 0


class Channel:
    """Serves the unit socket for the execution ``execution()`` returns, whose identity is
    ``identity()``; ``evidence()`` is the body of the answer to a matching hello."""

    def __init__(
        self,
        identity: Callable[[], peer.UnitIdentity],
        execution: Callable[[], Execution | None],
        evidence: Callable[[], dict[str, Any]],
        coordinator: MediaCoordinator | None = None,
    ) -> None:
        self._identity = identity
        self._execution = execution
        self._evidence = evidence
        self.coordinator = coordinator
        self.refused = 0
        """Socket messages and connections refused since control started."""
        self.open = 0
        self._pending: dict[asyncio.StreamWriter, float] = {}
        """Open connections that have not said hello yet, with when they opened."""
        self._logged: dict[str, float] = {}

    def refuse(self, kind: str, message: str, *args: object) -> None:
        """Count one refusal; log it unless a refusal of ``kind`` was logged within
        :data:`LOG_EVERY_SECONDS`."""
        self.refused += 1
        now = time.monotonic()
        if now - self._logged.get(kind, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._logged[kind] = now
            log.warning("unit socket: " + message + " (%d refused so far)", *args, self.refused)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection (the callback of ``asyncio.start_unix_server``)."""
        if self.open >= MAX_CONNECTIONS:
            if not self._pending:
                self.refuse("connections", "a connection refused: %d are open already", self.open)
                writer.close()
                return
            # Make room by closing the oldest that never said hello: idle connections cannot
            # keep execution out.
            oldest = min(self._pending, key=self._pending.__getitem__)
            del self._pending[oldest]
            self.refuse("connections", "a connection without hello closed to make room")
            oldest.close()
        self.open += 1
        self._pending[writer] = time.monotonic()
        try:
            await self._converse(reader, writer)
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            self._pending.pop(writer, None)
            writer.close()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        own: peer.UnitIdentity | None = None
        hello_by = time.monotonic() + HELLO_SECONDS
        while True:
            try:
                if own is None:
                    line = await asyncio.wait_for(reader.readline(), max(0.0, hello_by - time.monotonic()))
                else:
                    line = await reader.readline()
            except TimeoutError:
                self.refuse("silent", "a connection closed: no hello within %.0f s", HELLO_SECONDS)
                return
            except ValueError:  # asyncio's stream limit: the line is longer than a message may be
                self.refuse("oversized", "a line over %d bytes refused", peer.MAX_MESSAGE_BYTES)
                return
            if not line or writer.is_closing():
                return
            await asyncio.sleep(0)  # a burst of buffered lines must not starve control's loops
            try:
                message = peer.decode(line)
            except ValueError as exc:
                self.refuse("malformed", "a malformed message refused: %s", exc)
                continue
            current = self._identity()
            if own is not None and own != current:
                self.refuse(
                    "stale",
                    "a connection of generation %d closed: the unit is at %d",
                    own.generation,
                    current.generation,
                )
                return
            if (why := peer.stale_reason(message, current)) is not None:
                self.refuse("stale", "stale %s message refused: %s", message["kind"][:32], why)
                if own is None:
                    return
                continue
            ex = self._execution()
            kind = message["kind"]
            if ex is None:
                return
            if kind == "hello":
                if own is not None:
                    self.refuse("order", "a second hello on one connection refused")
                    continue
                if (caller := peer_pid(writer)) != ex.process.pid:
                    self.refuse(
                        "impostor", "a hello from pid %s refused: execution is pid %d", caller, ex.process.pid
                    )
                    return
                own = current
                self._pending.pop(writer, None)
                ex.writer = writer
                await peer.send(writer, "evidence", current, **self._evidence())
            elif own is None:
                self.refuse("order", "a %s message before hello refused", kind[:32])
            elif kind == "ready":
                ex.ready.set()
                ex.status_at = time.monotonic()
                log.info("execution ready: generation %d, peer evidence matched", current.generation)
            elif kind == "status":
                ex.status = {k: v for k, v in message.items() if k not in ("kind", "unit")}
                ex.status_at = time.monotonic()
            elif kind in ("media_request", "media_release") and self.coordinator is not None:
                await self._coordinate(kind, message, current, writer)
            else:
                self.refuse("unknown", "a message of unknown kind %r refused", kind[:32])

    async def _coordinate(
        self, kind: str, message: dict[str, Any], current: peer.UnitIdentity, writer: asyncio.StreamWriter
    ) -> None:
        """A request to (or release of) the media coordinator; every grant it makes goes back as a
        ``media_grant`` with the attempt's identity."""
        assert self.coordinator is not None
        try:
            req = Request.of(current.generation, message)
        except ValueError as exc:
            self.refuse("malformed", "a malformed %s refused: %s", kind, exc)
            return
        if kind == "media_request":
            try:
                granted = self.coordinator.request(req)
            except TooManyRequests as exc:
                self.refuse("flood", "a media request refused: %s", exc)
                return
        else:
            granted = self.coordinator.release(req.generation, req.request)
        for g in granted:
            log.info(
                "media coordinator: %s granted (%d of %d)",
                g.operation,
                self.coordinator.holding(g.operation),
                self.coordinator.bounds.get(g.operation, 0),
                extra={"job_id": g.job_id, "attempt": g.attempt},
            )
            await peer.send(
                writer, "media_grant", current, request=g.request, job_id=g.job_id, attempt=g.attempt
            )


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The pid of the process at the other end of a Unix socket, as the kernel saw it connect
    (``SO_PEERCRED``, unix(7)): a hello counts only from execution itself."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return int(pid)


def remove_stale_socket_dirs(run_dir: str) -> None:
    """Remove the socket directories (``hm-unit-<pid>-*``) of controls of this user that died
    without cleaning up (SIGKILL): their pid is no longer alive."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(run_dir):
            parts = entry.name.split("-")
            if (
                len(parts) < 4
                or parts[:2] != ["hm", "unit"]
                or not (parts[2].isascii() and parts[2].isdigit())
            ):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid():
                    if not psutil.pid_exists(int(parts[2])):
                        shutil.rmtree(entry.path, ignore_errors=True)
