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
worker and the reaper at the same moment) charges or releases once.
"""

from __future__ import annotations

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
        request: credits_pb2.CommitRequest | credits_pb2.ReleaseRequest
        if outcome == "completed" or (outcome == "failed" and actual_millicredits > 0):
            method: Any = self._credits.Commit
            request = commit_request(job_id, actual_millicredits, lines or {})
        elif outcome in RELEASED:
            method, request = self._credits.Release, credits_pb2.ReleaseRequest(job_id=job_id)
        else:
            raise ValueError(f"{outcome!r} does not end a job")
        async for attempt in infra_retry(3 if retry else 1):
            with attempt:
                response = await call(method, request)
        return not response.already_settled

    async def sweep(self, pool: asyncpg.Pool, grace_seconds: float, batch: int) -> int:
        """The reaper's settlement of what no path settled: every hold still held more than
        ``grace_seconds`` after its job ended (or after it was taken, for a job never created) is
        settled as :meth:`settle` would have. Reads at most :data:`SWEEP_PAGES` pages of ``batch``
        held holds, oldest first, going on where the previous sweep of this object stopped (and
        from the start again after the last page), so every hold is looked at however many jobs
        hold credits. A failure to settle one is logged and left to a later sweep.

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
            for job_id, _ in holds:
                if job_id not in outcomes:
                    continue  # still running, or ended within the grace
                status, actual, lines = outcomes[job_id]
                try:
                    if await self.settle(job_id, status, actual_millicredits=actual, lines=lines):
                        settled += 1
                except DomainError:
                    log.exception("could not settle the credits of an ended job")
            self._cursor = page.next_page_token
            if not self._cursor:
                break
        return settled
