"""What a unit checks of the work routed to it before it launches execution (seed 001, issue 19):
every operation whose active profile routes it to the unit's queue has a handler in the role, and
a bounded retry policy.

A problem here is a configuration error (exit 78): the profiles in ``processing_profiles`` are
the platform's configuration, and a unit that started anyway would fail every such job.
"""

from __future__ import annotations

import pkgutil

import asyncpg

from hypermedia.jobs import noop

MAX_ATTEMPTS_BOUND = 10
"""The most attempts a profile may give a job (the shipped profiles give 3): more is not a retry
policy but a loop, and a unit refuses to serve it."""


def handled_operations(path: str) -> frozenset[str]:
    """The operations of a role's handler, from ``module:NAME`` (its ``OPERATIONS`` tuple), and
    ``noop``, which every worker's runtime handles (it runs, or fails at once with
    ``OPERATION_NOT_ENABLED``: :mod:`hypermedia.jobs.noop`)."""
    return frozenset(pkgutil.resolve_name(path)) | {noop.OPERATION}


async def routing_problems(pool: asyncpg.Pool, queue: str, handled: frozenset[str], role: str) -> list[str]:
    """Every problem of the active profiles on ``queue`` for a unit of ``role`` handling
    ``handled``: an operation without a handler, a ``max_attempts`` above
    :data:`MAX_ATTEMPTS_BOUND`, a negative backoff. Also a queue no active profile routes to."""
    rows = await pool.fetch(
        "SELECT operation, version, max_attempts, backoff_base_seconds FROM processing_profiles "
        "WHERE queue = $1 AND active ORDER BY operation",
        queue,
    )
    problems = []
    for row in rows:
        where = f"profile {row['operation']} v{row['version']} on queue {queue}"
        if row["operation"] not in handled:
            problems.append(f"{where}: the {role} has no handler for {row['operation']}")
        if not 1 <= row["max_attempts"] <= MAX_ATTEMPTS_BOUND:
            problems.append(
                f"{where}: max_attempts {row['max_attempts']} is not a bounded retry policy (1-{MAX_ATTEMPTS_BOUND})"
            )
        if row["backoff_base_seconds"] < 0:
            problems.append(f"{where}: backoff_base_seconds {row['backoff_base_seconds']} is negative")
    if not [r for r in rows if r["operation"] != noop.OPERATION]:
        problems.append(f"queue {queue}: no active profile routes any operation to it")
    return problems
