"""One settlement: the credit outcome of a job, decided in one place for every path that ends one.

A job's credits are held when it is created (the gateway's EstimateAndHold, all of a request's
jobs at once) and settled once it ends: a ``completed`` job is charged its ``actual_credits`` (its charge lines as
ledger rows of their own), and so is a ``failed`` one that recorded a charge (it failed because
of its input: :mod:`hypermedia.jobs.charges`); any other ``failed`` or ``cancelled`` one — or one
whose creation did not happen after its hold was taken (:data:`UNCREATED`) — is released. The paths that end a job call
:meth:`Settlement.settle` with the status they wrote (the worker after completing, failing or
cancelling; the gateway after cancelling a job that had not started, or when creation failed after
the hold); the reaper calls :meth:`Settlement.sweep` for the settlements that never happened (a
call that failed, a process that died between the job's transition and the call).

The credits service owns its tables (the holds, the ledger, the accounts' balances); this
module only asks it over gRPC. Commit and Release are idempotent per job, so settling twice (a
worker and the reaper at the same moment) charges or releases once. A worker does not wait for
its settlements: :class:`SettlementBatch` sends them in the background, every settlement that
arrived while the previous call was in flight in one ``Settle`` call (one transaction), and the
reaper's sweep settles a page of holds in one call too.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Final

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core.errors import DomainError
from hypermedia.infra.rpc import call, infra_retry
from hypermedia.jobs import lifecycle
from hypermedia.jobs.lifecycle.recovery import UNCREATED

log = logging.getLogger(__name__)

RELEASED: Final = frozenset({"failed", "cancelled", UNCREATED})
"""Outcomes whose hold is released without a charge (``failed``: unless it recorded one)."""
MAX_SETTLE: Final = 1000
"""Most jobs in one ``Settle`` call (the credits service's limit, ``services/credits``)."""
SWEEP_PAGES: Final = 20
"""Pages of held holds (``ListHolds``) one :meth:`Settlement.sweep` reads at most, so a run stays
bounded when many queued or running jobs hold credits (the next sweep goes on from there)."""


def commit_request(job_id: str, actual_millicredits: int, lines: dict[str, int]) -> credits_pb2.CommitRequest:
    """The Commit of a completed job: ``actual_millicredits`` in all, ``lines`` (by name) of it
    charged as ledger rows of their own, the rest as ``base``."""
    return credits_pb2.CommitRequest(
        job_id=job_id,
        actual_millicredits=actual_millicredits,
        lines=[
            credits_pb2.ChargeLine(line=name, millicredits=amount) for name, amount in sorted(lines.items())
        ],
    )


SettleRequest = credits_pb2.CommitRequest | credits_pb2.ReleaseRequest
"""One job's part of a ``Settle`` call."""


def settle_request(
    job_id: str, outcome: str, actual_millicredits: int = 0, lines: dict[str, int] | None = None
) -> SettleRequest:
    """What settles the hold of ``job_id``, ended ``outcome`` (see :meth:`Settlement.settle`): a
    Commit of ``actual_millicredits`` (``lines`` of it), or a Release.

    Raises:
        ValueError: an outcome that does not end a job.
    """
    if outcome == "completed" or (outcome == "failed" and actual_millicredits > 0):
        return commit_request(job_id, actual_millicredits, lines or {})
    if outcome in RELEASED:
        return credits_pb2.ReleaseRequest(job_id=job_id)
    raise ValueError(f"{outcome!r} does not end a job")


class Settlement:
    """Settles jobs' credits through the credits service.

    Args:
        credits: gRPC stub of the credits service.
    """

    def __init__(self, credits: credits_pb2_grpc.CreditsServiceStub) -> None:
        self._credits = credits
        self._cursor = ""
        """Where the next :meth:`sweep` goes on (a ListHolds page token; empty: the start)."""

    async def settle(
        self,
        job_id: str,
        outcome: str,
        *,
        actual_millicredits: int = 0,
        lines: dict[str, int] | None = None,
        retry: bool = False,
    ) -> bool:
        """Settles the hold of ``job_id`` for its ``outcome``: ``completed`` commits
        ``actual_millicredits`` (``lines`` of it as their own ledger rows), and so does
        ``failed`` with a charge (``actual_millicredits`` > 0, :func:`~hypermedia.jobs.charges.for_failure`);
        anything else in :data:`RELEASED` releases. ``retry``: up to three tries on a transient failure
        (:func:`~hypermedia.infra.rpc.infra_retry`), for a worker inside its attempt.

        Returns True when this call settled the hold, False when it was settled already.

        Raises:
            ValueError: an outcome that does not end a job.
            DomainError: the credits service refused or could not be reached (the hold stays held;
                the reaper's :meth:`sweep` settles it later).
        """
        request = settle_request(job_id, outcome, actual_millicredits, lines)
        method: Any = self._credits.Commit
        if isinstance(request, credits_pb2.ReleaseRequest):
            method = self._credits.Release
        async for attempt in infra_retry(3 if retry else 1):
            with attempt:
                response = await call(method, request)
        return not response.already_settled

    async def settle_many(self, requests: list[SettleRequest], *, retry: bool = False) -> int:
        """Settles many jobs in one ``Settle`` call (one transaction), each request from
        :func:`settle_request`, at most :data:`MAX_SETTLE`. ``retry`` as :meth:`settle`.
        Returns how many holds this call settled: the others were settled already, or are
        logged, each at WARNING (a commit of a job that held nothing; an entry the service
        refused, which holds up no other and stays held).

        Raises:
            DomainError: the credits service could not be reached, or refused the call for more
                than :data:`MAX_SETTLE` jobs (the holds stay held for the reaper).
        """
        batch = credits_pb2.SettleRequest(
            commits=[r for r in requests if isinstance(r, credits_pb2.CommitRequest)],
            releases=[r for r in requests if isinstance(r, credits_pb2.ReleaseRequest)],
        )
        async for attempt in infra_retry(3 if retry else 1):
            with attempt:
                response = await call(self._credits.Settle, batch)
        for result in response.results:
            if result.outcome == credits_pb2.SettledJob.OUTCOME_NO_HOLD:
                log.warning("no hold to commit for an ended job", extra={"job_id": result.job_id})
            elif result.outcome == credits_pb2.SettledJob.OUTCOME_REFUSED:
                log.warning("settlement refused: %s", result.refusal, extra={"job_id": result.job_id})
        return sum(r.outcome == credits_pb2.SettledJob.OUTCOME_SETTLED for r in response.results)

    async def sweep(self, pool: asyncpg.Pool, grace_seconds: float, batch: int) -> int:
        """The reaper's settlement of what no path settled: every hold still held more than
        ``grace_seconds`` after its job ended (or after it was taken, for a job never created) is
        settled as :meth:`settle` would have. Reads at most :data:`SWEEP_PAGES` pages of ``batch``
        held holds, oldest first, going on where the previous sweep of this object stopped (and
        from the start again after the last page), so every hold is looked at however many jobs
        hold credits. A failure to settle one is logged and left to a later sweep; one the credits
        service refuses (``Settle`` answers per job) holds up no other of its page.

        Returns how many holds this sweep settled.

        Raises:
            DomainError: the credits service could not list its holds.
        """
        settled = 0
        for _ in range(SWEEP_PAGES):
            page = await call(
                self._credits.ListHolds,
                credits_pb2.ListHoldsRequest(page_size=batch, page_token=self._cursor),
            )
            holds = [(hold.job_id, hold.created_at.ToDatetime(datetime.UTC)) for hold in page.holds]
            outcomes = await lifecycle.settleable(pool, holds, grace_seconds)
            requests = [  # leaves out jobs still running, or ended within the grace
                settle_request(job_id, *outcomes[job_id]) for job_id, _ in holds if job_id in outcomes
            ]
            if requests:
                try:
                    settled += await self.settle_many(requests)
                except DomainError:
                    log.exception("could not settle the credits of %d ended jobs", len(requests))
            self._cursor = page.next_page_token
            if not self._cursor:
                break
        return settled


class SettlementBatch:
    """A worker's settlements, sent without holding up its jobs: :meth:`submit` queues one and
    returns; one background task sends what is queued in one ``Settle`` call, and what arrives
    meanwhile in the next (group commit: a lone job is sent at once, a busy worker's jobs share
    calls). A call that fails after :func:`~hypermedia.infra.rpc.infra_retry`'s tries is logged
    and its holds are left to the reaper's sweep, as a worker that dies before its call leaves
    them; so are settlements past :data:`MAX_QUEUED` while the credits service does not answer.
    One entry the service refuses holds up no other (``Settle`` answers it per job).
    :meth:`flush` waits for what is queued (a stopping worker).

    Args:
        settlement: how the calls are made.
    """

    MAX_QUEUED: Final = 10 * MAX_SETTLE
    """Most settlements waiting to be sent; more (credits unreachable for long, a worker ending
    jobs fast) are left to the reaper's sweep, logged."""

    def __init__(self, settlement: Settlement) -> None:
        self._settlement = settlement
        self._queued: list[SettleRequest] = []
        self._sender: asyncio.Task[None] | None = None

    def submit(
        self, job_id: str, outcome: str, *, actual_millicredits: int = 0, lines: dict[str, int] | None = None
    ) -> None:
        """Queues the settlement of ``job_id``, ended ``outcome`` (:func:`settle_request`; raises
        its ValueError here, at once). Needs a running event loop. The call is made in the
        context of the job whose settlement starts the sender task (its trace shows the
        ``Settle`` span; jobs that joined that call do not)."""
        request = settle_request(job_id, outcome, actual_millicredits, lines)
        if len(self._queued) >= self.MAX_QUEUED:
            log.warning("settlement queue full; left to the reaper", extra={"job_id": job_id})
            return
        self._queued.append(request)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())

    async def flush(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for every queued settlement to be sent or given up
        (left to the reaper, logged). Returns whether nothing is queued or in flight any more."""
        if self._sender is not None:
            await asyncio.wait({self._sender}, timeout=timeout)
        return not self._queued and (self._sender is None or self._sender.done())

    async def _send(self) -> None:
        while self._queued:
            batch, self._queued = self._queued[:MAX_SETTLE], self._queued[MAX_SETTLE:]
            try:
                await self._settlement.settle_many(batch, retry=True)
            except Exception as exc:  # never the sender's end: what is queued behind still goes
                log.warning(
                    "credits settlement of %d jobs failed (%s); left to the reaper",
                    len(batch),
                    getattr(exc, "error_code", type(exc).__name__),
                )
