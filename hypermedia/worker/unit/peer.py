"""The private Unix socket between a worker unit's control and its execution (seed 001, ADR 0046).

Every message is one line of JSON with the unit's identity in it: deployment, unit name, boot (a
fresh id per start of control), epoch (of the deployment lease) and generation (of execution's
launch). A message whose identity differs from the receiver's is stale: refused and logged
(:func:`stale_reason`), never acted on.

Execution → control: ``hello`` (once, on connect: its worker id and pid), ``ready`` (its
dependencies are open), ``status`` (every second: slots, busy, admission reason),
``media_request``/``media_release`` (the media coordinator, with the attempt's identity:
:mod:`hypermedia.worker.unit.coordinator`).
Control → execution: ``evidence`` (the answer to a matching ``hello``: execution admits no business
work before it; it names the coordinator's bounds, if control keeps one), ``admission`` (the
autoscaler's target and why, with the age of each sample), ``media_grant``.
What control refuses, and how it counts refusals: :mod:`hypermedia.worker.unit.channel`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
"""Longest line either side reads; a longer one ends the connection (asyncio's stream limit)."""

ENV_SOCKET = "HM_UNIT_SOCKET"
"""The variables control hands execution (and refuses to inherit: identity is control's to derive)."""
ENV_UNIT = "HM_UNIT_NAME"
ENV_BOOT = "HM_UNIT_BOOT"
ENV_EPOCH = "HM_UNIT_EPOCH"
ENV_GENERATION = "HM_WORKER_GENERATION"
ENV_CONTROL_PID = "HM_UNIT_CONTROL_PID"


@dataclass(frozen=True)
class UnitIdentity:
    """Who a message is from and for: ``deployment`` and ``unit`` (the lease's key), ``boot`` (32
    hex digits, new at every start of control), ``epoch`` (the lease's, ≥ 1) and ``generation``
    (execution's launch, 0 first, +1 at every relaunch)."""

    deployment: str
    unit: str
    boot: str
    epoch: int
    generation: int

    def env(self, socket_path: str) -> dict[str, str]:
        """The variables that hand this identity, the socket and control's pid to execution."""
        return {
            ENV_SOCKET: socket_path,
            ENV_CONTROL_PID: str(os.getpid()),
            "HM_DEPLOYMENT": self.deployment,
            ENV_UNIT: self.unit,
            ENV_BOOT: self.boot,
            ENV_EPOCH: str(self.epoch),
            ENV_GENERATION: str(self.generation),
        }

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> UnitIdentity | None:
        """The identity control handed this process, ``None`` when it runs without control (no
        ``HM_UNIT_SOCKET``: a worker started on its own, as in tests and ``hypermedia up``).

        Raises:
            ValueError: the socket is set but a variable of the identity is missing or malformed.
        """
        if not environ.get(ENV_SOCKET):
            return None
        try:
            return cls(
                environ["HM_DEPLOYMENT"],
                environ[ENV_UNIT],
                environ[ENV_BOOT],
                int(environ[ENV_EPOCH]),
                int(environ[ENV_GENERATION]),
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{ENV_SOCKET} is set but the unit identity is incomplete: {exc}") from None


def die_with_control(environ: dict[str, str] | os._Environ[str]) -> None:
    """Execution ends with its control, as the processes of a container end with its PID 1
    (``PR_SET_PDEATHSIG`` = SIGKILL, prctl(2); the zygote and the job children have theirs): set,
    then checked against a control that died before it was set.

    Raises:
        ConnectionError: control (``HM_UNIT_CONTROL_PID``) is no longer this process's parent.
    """
    from hypermedia.sandbox.confine import _PR_SET_PDEATHSIG, _prctl

    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = environ.get(ENV_CONTROL_PID, "")
    if expected.isascii() and expected.isdigit() and os.getppid() != int(expected):
        raise ConnectionError("the unit's control is gone")


def encode(kind: str, identity: UnitIdentity, **body: Any) -> bytes:
    """One message: ``{"kind": kind, "unit": identity, **body}`` as a JSON line."""
    return (
        json.dumps({"kind": kind, "unit": asdict(identity), **body}, separators=(",", ":")).encode() + b"\n"
    )


def decode(line: bytes) -> dict[str, Any]:
    """The message of one line.

    Raises:
        ValueError: not a JSON object with a ``kind`` and a ``unit``.
    """
    try:
        message = json.loads(line)
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise ValueError("a message nested too deep") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise ValueError("not a message")
    if not isinstance(message.get("unit"), dict):
        raise ValueError("a message without the unit's identity")
    return message


def stale_reason(message: dict[str, Any], own: UnitIdentity) -> str | None:
    """Why ``message`` is not for ``own`` (e.g. ``epoch 3, the unit's is 4``); ``None`` when its
    identity is exactly ``own``: the same values of the same JSON types (``true`` is not epoch 1,
    ``1.0`` is not generation 1)."""
    theirs = message.get("unit") or {}
    for name, value in asdict(own).items():
        if type(theirs.get(name)) is not type(value) or theirs.get(name) != value:
            return f"{name} {theirs.get(name)!r}, the unit's is {value!r}"
    return None


async def send(writer: asyncio.StreamWriter, kind: str, identity: UnitIdentity, **body: Any) -> None:
    """Write one message and wait until the socket took it."""
    writer.write(encode(kind, identity, **body))
    await writer.drain()


class ControlLink:
    """Execution's side of the socket: :meth:`connect` says ``hello`` and waits for control's
    matching ``evidence``; after it, :meth:`run` reads control's ``admission`` messages into
    ``on_admission`` and sends ``status`` every second until the socket closes (``lost`` is then set:
    control is gone, and execution stops)."""

    def __init__(
        self,
        identity: UnitIdentity,
        socket_path: str,
        on_admission: Callable[[dict[str, Any]], None],
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self.identity = identity
        self._path = socket_path
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {"admission": on_admission}
        """What :meth:`run` does with each kind of message from control (others are ignored)."""
        self.on_lost: list[Callable[[], None]] = []
        """Called once when the connection ended."""
        self._status = status
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.evidence_matched = False
        self.evidence: dict[str, Any] = {}
        """Control's evidence message (``lease_expires_at``, ``coordinator``: its media bounds)."""
        self.lost = asyncio.Event()
        self.refused = 0
        """Messages refused as stale since the connection opened."""

    async def connect(self, worker_id: str) -> None:
        """Say ``hello`` and wait for ``evidence`` of the same identity (stale messages before it
        are refused and logged).

        Raises:
            ConnectionError: the socket closed before the evidence came.
            OSError: the socket cannot be reached.
        """
        self._reader, self._writer = await asyncio.open_unix_connection(self._path, limit=MAX_MESSAGE_BYTES)
        await send(self._writer, "hello", self.identity, worker_id=worker_id, pid=os.getpid())
        while True:
            message = await self._next()
            if message is None:
                raise ConnectionError("control closed the unit socket before it sent its evidence")
            if message["kind"] == "evidence":
                self.evidence_matched = True
                self.evidence = message
                log.info(
                    "peer evidence matched: unit %s boot %s epoch %d generation %d",
                    self.identity.unit,
                    self.identity.boot[:8],
                    self.identity.epoch,
                    self.identity.generation,
                )
                return

    async def ready(self) -> None:
        """Tell control the dependencies are open."""
        await self.send("ready")

    async def send(self, kind: str, **body: Any) -> None:
        """One message of this identity to control.

        Raises:
            ConnectionError: the link is closed (or was never opened).
        """
        if self._writer is None or self.lost.is_set():
            raise ConnectionError("the unit socket is closed")
        await send(self._writer, kind, self.identity, **body)

    async def _next(self) -> dict[str, Any] | None:
        """The next message meant for this identity; stale and malformed ones are refused (logged,
        counted, skipped). ``None`` at the end of the stream."""
        assert self._reader is not None
        while True:
            try:
                line = await self._reader.readline()
            except (ConnectionError, ValueError):  # ValueError: a line over the limit
                return None
            if not line:
                return None
            try:
                message = decode(line)
            except ValueError:
                self.refused += 1
                log.warning("unit socket: a malformed message refused")
                continue
            if (why := stale_reason(message, self.identity)) is not None:
                self.refused += 1
                log.warning("unit socket: stale %s message refused: %s", message["kind"], why)
                continue
            return message

    async def run(self) -> None:
        """Apply control's messages (:attr:`handlers`) and report status every second until the
        end of the connection (which sets ``lost``). Status goes on during a drain: control
        contains an execution silent for 30 s, and a drain may take 35."""
        assert self._writer is not None
        reporting = asyncio.create_task(self._report())
        try:
            while (message := await self._next()) is not None:
                if (handle := self.handlers.get(message["kind"])) is not None:
                    handle(message)
        finally:
            reporting.cancel()
            self.lost.set()
            for lost in self.on_lost:
                lost()

    async def _report(self) -> None:
        assert self._writer is not None
        while True:
            try:
                await send(self._writer, "status", self.identity, **self._status())
            except (ConnectionError, OSError):
                return
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
