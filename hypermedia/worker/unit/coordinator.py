"""The media coordinator of a worker unit (seed 001: at most 3 video jobs and 1 audio rendition
per unit), kept by control and asked by execution over the unit socket (ADR 0046).

Shape::

    execution                                      control (MediaCoordinator)
    admit(job) ─ media_request {request, job_id, attempt, operation} ─▶ granted now, or queued FIFO
               ◀─ media_grant {request, job_id, attempt} ─────────────── (now, or at a release)
    leave      ─ media_release {request, job_id, attempt} ─▶ frees it (or withdraws a queued one)
    execution contained ─▶ drop(generation): every grant and request of it is gone

Every request carries the unit's identity (generation included, :mod:`peer`) and the attempt's
(job id and attempt number, the fencing token), so a grant is never handed to an attempt or a
generation it was not asked for, and the slots a dead execution held are freed only after
containment confirmed none of its processes lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from hypermedia.jobs.lifecycle import ClaimedJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """One attempt's request: ``request`` (execution's counter), the generation that asked, the
    attempt's identity and the operation bounded."""

    generation: int
    request: int
    job_id: str
    attempt: int
    operation: str

    @classmethod
    def of(cls, generation: int, message: dict[str, Any]) -> Request:
        """The request a ``media_request``/``media_release`` message names.

        Raises:
            ValueError: a field is missing or of the wrong JSON type.
        """
        values = {k: message.get(k) for k in ("request", "job_id", "attempt", "operation")}
        if not (
            type(values["request"]) is int
            and type(values["attempt"]) is int
            and isinstance(values["job_id"], str)
            and isinstance(values["operation"], str)
        ):
            raise ValueError("a media request needs request (int), job_id, attempt (int) and operation")
        return cls(generation, **values)  # type: ignore[arg-type]

    def key(self) -> tuple[int, int]:
        return (self.generation, self.request)


MAX_OUTSTANDING = 256
"""Requests one generation may have held or waiting at once (a worker has at most 64 slots, each
with one job): more is refused, so a runaway execution cannot grow control's memory."""


class TooManyRequests(ValueError):
    """A generation asked for more than :data:`MAX_OUTSTANDING` at once."""


class MediaCoordinator:
    """Control's bookkeeping: ``bounds`` (operation → jobs at once, e.g. ``{"transcode_video": 3,
    "transcode_audio": 1}``); an operation without a bound is granted at once. Every step is
    O(1) but a release's grants and :meth:`drop` (O(outstanding))."""

    def __init__(self, bounds: dict[str, int]) -> None:
        self.bounds = dict(bounds)
        self.held: dict[tuple[int, int], Request] = {}
        self._waiting: dict[str, dict[tuple[int, int], Request]] = {op: {} for op in bounds}
        """Per operation, in the order asked (dicts keep insertion order)."""
        self._holding: dict[str, int] = dict.fromkeys(bounds, 0)
        self._outstanding: dict[int, int] = {}

    def holding(self, operation: str) -> int:
        return self._holding.get(operation, 0)

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def request(self, req: Request) -> list[Request]:
        """Ask for ``req``; the requests granted by it (``[req]`` or ``[]`` while it waits). A
        request number already held or waiting (for any operation) changes nothing.

        Raises:
            TooManyRequests: the generation has :data:`MAX_OUTSTANDING` outstanding already.
        """
        key = req.key()
        if key in self.held or any(key in q for q in self._waiting.values()):
            return []
        if self._outstanding.get(req.generation, 0) >= MAX_OUTSTANDING:
            raise TooManyRequests(f"more than {MAX_OUTSTANDING} media requests outstanding")
        self._outstanding[req.generation] = self._outstanding.get(req.generation, 0) + 1
        bound = self.bounds.get(req.operation)
        if bound is not None and self.holding(req.operation) >= bound:
            self._waiting[req.operation][key] = req
            return []
        self._hold(req)
        return [req]

    def release(self, generation: int, request: int) -> list[Request]:
        """Free (or withdraw, while it waits) a request; the waiting requests granted by it."""
        key = (generation, request)
        freed = self.held.pop(key, None)
        if freed is None:
            for queue in self._waiting.values():
                if queue.pop(key, None) is not None:
                    self._outstanding[generation] -= 1
            return []
        self._outstanding[generation] -= 1
        if freed.operation in self._holding:
            self._holding[freed.operation] -= 1
            return self._grant_waiting(freed.operation)
        return []

    def drop(self, generation: int) -> int:
        """Forget every grant and request of ``generation`` (contained: none of its processes
        lives); how many grants were freed."""
        freed = [k for k, r in self.held.items() if r.generation == generation]
        for k in freed:
            operation = self.held.pop(k).operation
            if operation in self._holding:
                self._holding[operation] -= 1
        for operation, queue in self._waiting.items():
            self._waiting[operation] = {k: r for k, r in queue.items() if r.generation != generation}
        self._outstanding.pop(generation, None)
        return len(freed)

    def _hold(self, req: Request) -> None:
        self.held[req.key()] = req
        if req.operation in self._holding:
            self._holding[req.operation] += 1

    def _grant_waiting(self, operation: str) -> list[Request]:
        granted = []
        queue = self._waiting[operation]
        while queue and self.holding(operation) < self.bounds[operation]:
            key = next(iter(queue))
            req = queue.pop(key)
            self._hold(req)
            granted.append(req)
        return granted


class CoordinatorClient:
    """Execution's side: :meth:`admit` is a :meth:`JobHandler.admit` that asks control.
    ``send(kind, **body)`` writes one message on the link; :meth:`granted` takes control's
    ``media_grant`` messages; :meth:`lost` fails every wait when the link closed."""

    def __init__(self, send: Callable[..., Any]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[None]] = {}

    @contextlib.asynccontextmanager
    async def admit(self, job: ClaimedJob) -> AsyncIterator[None]:
        """Held from control's grant to the end of the block; a cancelled wait withdraws the
        request. Raises ConnectionError when the link to control is gone."""
        request = next(self._ids)
        body = {"request": request, "job_id": job.job_id, "attempt": job.attempt, "operation": job.operation}
        granted = asyncio.get_running_loop().create_future()
        self._waiting[request] = granted
        try:
            await self._send("media_request", **body)
            await granted
        except BaseException:
            self._waiting.pop(request, None)
            with contextlib.suppress(ConnectionError, OSError):
                await asyncio.shield(self._send("media_release", **body))
            raise
        try:
            yield
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                await self._send("media_release", **body)

    def granted(self, message: dict[str, Any]) -> None:
        request = message.get("request")
        future = self._waiting.pop(request, None) if type(request) is int else None
        if future is not None and not future.done():
            future.set_result(None)

    def lost(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the unit's control is gone"))
        self._waiting.clear()
