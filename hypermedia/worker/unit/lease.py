"""The deployment lease of a worker unit in Postgres (``worker_unit_leases``, migration 0019): one live
unit per ``(deployment, unit)``, and an epoch that goes up by one at every taking (ADR 0046).

Control takes the lease before it launches execution (:func:`acquire`), renews it every third of its
time to live (:func:`renew`) and releases it when it stops (:func:`release`). Execution observes it:
it checks that the epoch control hands it is the row's (:func:`current_epoch`)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import asyncpg


class LeaseHeld(Exception):
    """Another live unit holds the deployment lease: ``holder`` (``host/pid``) took it at epoch
    ``epoch`` and it runs for ``seconds_left`` more unless renewed. Control exits 75."""

    def __init__(self, deployment: str, unit: str, holder: str, epoch: int, seconds_left: float) -> None:
        super().__init__(
            f"the deployment lease of unit {unit!r} in deployment {deployment!r} is held by {holder} "
            f"(epoch {epoch}) for {seconds_left:.0f} s more: one live unit per deployment and unit name"
        )
        self.holder = holder
        self.epoch = epoch
        self.seconds_left = seconds_left


@dataclass(frozen=True)
class Lease:
    """A lease this process holds: ``epoch`` and until when (``expires_at``, the server's clock)."""

    deployment: str
    unit: str
    epoch: int
    holder: str
    expires_at: datetime.datetime


async def acquire(
    pool: asyncpg.Pool, deployment: str, unit: str, *, boot_id: str, holder: str, ttl_seconds: float
) -> Lease:
    """Take the lease of ``(deployment, unit)`` for ``ttl_seconds``: a new row at epoch 1, or the
    row of a unit that released it or let it expire at the next epoch (one conditional statement,
    so of two units starting at once exactly one wins).

    Raises:
        LeaseHeld: the row is live (not released, ``expires_at`` ahead) and someone else's.
    """
    row = await pool.fetchrow(
        """
        INSERT INTO worker_unit_leases AS l (deployment, unit, epoch, boot_id, holder, expires_at)
        VALUES ($1, $2, 1, $3, $4, now() + make_interval(secs => $5))
        ON CONFLICT (deployment, unit) DO UPDATE
            SET epoch = l.epoch + 1, boot_id = EXCLUDED.boot_id, holder = EXCLUDED.holder,
                acquired_at = now(), renewed_at = now(), expires_at = EXCLUDED.expires_at,
                released_at = NULL
            WHERE l.released_at IS NOT NULL OR l.expires_at < now()
        RETURNING epoch, expires_at
        """,
        deployment,
        unit,
        boot_id,
        holder,
        ttl_seconds,
    )
    if row is None:
        held = await pool.fetchrow(
            """
            SELECT holder, epoch, extract(epoch FROM expires_at - now())::float8 AS left
            FROM worker_unit_leases WHERE deployment = $1 AND unit = $2
            """,
            deployment,
            unit,
        )
        if held is None:  # released and deleted in between: cannot happen, rows are never deleted
            raise LeaseHeld(deployment, unit, "an unknown holder", 0, 0.0)
        raise LeaseHeld(deployment, unit, held["holder"], held["epoch"], max(0.0, held["left"]))
    return Lease(deployment, unit, int(row["epoch"]), holder, row["expires_at"])


async def renew(pool: asyncpg.Pool, lease: Lease, ttl_seconds: float) -> Lease | None:
    """Extend ``lease`` by ``ttl_seconds`` from now; ``None`` when it is lost: released, expired
    (someone may have taken it since: the holder must stop), or taken at a later epoch."""
    expires_at = await pool.fetchval(
        """
        UPDATE worker_unit_leases SET renewed_at = now(), expires_at = now() + make_interval(secs => $4)
        WHERE deployment = $1 AND unit = $2 AND epoch = $3 AND released_at IS NULL AND expires_at >= now()
        RETURNING expires_at
        """,
        lease.deployment,
        lease.unit,
        lease.epoch,
        ttl_seconds,
    )
    if expires_at is None:
        return None
    return Lease(lease.deployment, lease.unit, lease.epoch, lease.holder, expires_at)


async def release(pool: asyncpg.Pool, lease: Lease) -> bool:
    """Let ``lease`` go (a clean stop), so the next unit of the name starts at once. False when it
    was no longer this epoch's."""
    status = await pool.execute(
        """
        UPDATE worker_unit_leases SET released_at = now()
        WHERE deployment = $1 AND unit = $2 AND epoch = $3 AND released_at IS NULL
        """,
        lease.deployment,
        lease.unit,
        lease.epoch,
    )
    return status.endswith(" 1")


async def current_epoch(pool: asyncpg.Pool, deployment: str, unit: str) -> int | None:
    """The epoch of the live lease of ``(deployment, unit)``; ``None`` when none is live."""
    epoch = await pool.fetchval(
        """
        SELECT epoch FROM worker_unit_leases
        WHERE deployment = $1 AND unit = $2 AND released_at IS NULL AND expires_at >= now()
        """,
        deployment,
        unit,
    )
    return None if epoch is None else int(epoch)
