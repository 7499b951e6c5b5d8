"""The job lifecycle in Postgres: every state transition of ``processing_jobs`` lives here.

States (the seed's): ``created → queued → claimed → processing → completed``, with ``retry_wait``,
``failed``, ``cancelled`` and ``cancel_requested``; a delayed job starts ``scheduled`` and is
queued when due (ADR 0071). Each function is one transition, written as a
conditional ``UPDATE … WHERE status = …`` so that racing processes cannot both win; every write a
worker makes about a job is fenced by ``(claimed_by, attempt_count)``, so a worker whose lease
expired cannot complete, fail or charge a job someone else now holds.

Whenever a job (re-)enters ``queued`` an outbox row is written in the same transaction; the relay
(:mod:`hypermedia.jobs.outbox`) publishes it. Postgres is the truth, JetStream the delivery.

Modules: :mod:`~hypermedia.jobs.lifecycle.requests` (the caller's: create, cancel),
:mod:`~hypermedia.jobs.lifecycle.attempts` (a worker's: claim → complete / fail / cancel / hand
back, progress, leases), :mod:`~hypermedia.jobs.lifecycle.recovery` (the reaper's: lost leases,
retries, stale jobs, holds due for settlement), :mod:`~hypermedia.jobs.lifecycle.rules` (the one
rule for a lost attempt; the outbox rows) and :mod:`~hypermedia.jobs.lifecycle.caps` (an
account's cap of running jobs, checked at claim). Nothing else writes ``processing_jobs`` or
``job_attempts``: services decide, this package writes.
"""

from hypermedia.jobs.lifecycle.attempts import (
    ClaimedJob,
    Output,
    cancel_requested,
    claim,
    claim_held,
    claim_many,
    claim_retrying,
    complete,
    extend_leases,
    fail,
    failure_charge,
    fenced_status,
    hand_back,
    job_key,
    mark_cancelled,
    progress,
    reclaim,
)
from hypermedia.jobs.lifecycle.caps import HELD_REDELIVERY_SECONDS
from hypermedia.jobs.lifecycle.recovery import (
    expire_leases,
    next_scheduled,
    promote_retries,
    promote_scheduled,
    release_contained,
    republish_stale,
    settleable,
)
from hypermedia.jobs.lifecycle.requests import (
    NewJob,
    cancel_if_waiting,
    create_queued,
    job_status,
    request_cancel,
)
from hypermedia.jobs.lifecycle.rules import (
    FAIR_WINDOW,
    LEASE_MARGIN_SECONDS,
    LOST_ATTEMPT,
    MAX_LOST_ATTEMPTS,
    enqueue_outbox,
    enqueue_outbox_many,
    release_deferred,
    sweep_deferred,
)

__all__ = [
    "FAIR_WINDOW",
    "HELD_REDELIVERY_SECONDS",
    "LEASE_MARGIN_SECONDS",
    "LOST_ATTEMPT",
    "MAX_LOST_ATTEMPTS",
    "ClaimedJob",
    "NewJob",
    "Output",
    "cancel_if_waiting",
    "cancel_requested",
    "claim",
    "claim_held",
    "claim_many",
    "claim_retrying",
    "complete",
    "create_queued",
    "enqueue_outbox",
    "enqueue_outbox_many",
    "expire_leases",
    "extend_leases",
    "fail",
    "failure_charge",
    "fenced_status",
    "hand_back",
    "job_key",
    "job_status",
    "mark_cancelled",
    "next_scheduled",
    "progress",
    "promote_retries",
    "promote_scheduled",
    "reclaim",
    "release_contained",
    "release_deferred",
    "republish_stale",
    "request_cancel",
    "settleable",
    "sweep_deferred",
]
