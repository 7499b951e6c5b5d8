"""The reaper: the safety net under the job lifecycle. A loop around :meth:`Reaper.run_once`.

Each run, in one transaction per step, with ``FOR UPDATE SKIP LOCKED`` so several replicas never
requeue the same job twice:

1. **dead workers**: workers whose heartbeat is older than ``dead_worker_seconds`` are marked dead;
2. **lost leases**: jobs in ``claimed``/``processing``/``cancel_requested`` whose
   ``visibility_timeout`` passed, or whose worker is dead, go back to ``queued`` (published again),
   or to ``failed`` with ``WORKER_LOST`` once they lost :data:`lifecycle.MAX_LOST_ATTEMPTS`
   attempts (``cancelled`` when cancellation was requested). A dead worker's jobs are recovered at once, not when their leases run out;
3. **retry promotion**: ``retry_wait`` jobs whose ``next_attempt_at`` passed go to ``queued``;
4. **stale queued**: jobs ``queued`` longer than ``requeue_stale_seconds`` are published again, so
   a message the broker lost never strands a job (claims are idempotent, duplicates are dropped);
5. **unsettled holds**: jobs whose credit hold is still ``held`` more than ``settle_grace_seconds``
   after they ended — a Release or Commit that failed or was never made (the credits service was
   unreachable, or a process died between the job's transition and the call): ``failed`` and
   ``cancelled`` jobs are released, ``completed`` ones charged their ``actual_credits`` (with their ``charge_lines``); a hold
   whose job was never created (the gateway died, or could not reach Postgres, between Hold and
   the job's transaction, and its own Release failed too) is released;
6. **orphaned job directories** (when given ``work_dirs``, the workers' ``HM_WORK_DIR`` on this
   machine): a ``jobs/{job_id}/`` directory older than ``orphan_dir_seconds`` whose job is not
   running any more is removed — what a worker that died and never came back left behind. (A
   worker also sweeps its own directory when it starts; on Kubernetes a pod's emptyDir goes with it.)

Credits of jobs it fails or cancels are released through the credits service (Release is idempotent
per job, so releasing a hold someone else is releasing at the same moment is harmless).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core.errors import DomainError
from hypermedia.infra import db
from hypermedia.infra.rpc import call
from hypermedia.jobs import lifecycle

log = logging.getLogger(__name__)

SETTLE_GRACE_SECONDS = 60.0
"""Default of how long after a job ended its hold may still be held before the reaper settles it:
the path that ended the job settles it first; this only catches the calls that never happened."""
ORPHAN_DIR_SECONDS = 300.0
"""Default age (by mtime) before a job directory of a job that is not running counts as orphaned."""


@dataclass(frozen=True)
class ReapResult:
    """What one run did (job counts)."""

    requeued_expired: int = 0
    failed_expired: int = 0
    promoted: int = 0
    republished: int = 0
    dead_workers: int = 0
    settled_holds: int = 0
    """Holds of finished jobs released by step 5 (releases of jobs this run ended are not counted)."""
    removed_dirs: int = 0

    @property
    def anything(self) -> bool:
        return any(vars(self).values())


class Reaper:
    """Args: pool; credits stub; stream prefix; thresholds in seconds; ``work_dirs``: worker work
    directories on this machine whose orphaned job directories step 6 removes (none: step off)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        credits: credits_pb2_grpc.CreditsServiceStub,
        prefix: str,
        *,
        requeue_stale_seconds: float = 60.0,
        dead_worker_seconds: float = 120.0,
        settle_grace_seconds: float = SETTLE_GRACE_SECONDS,
        work_dirs: tuple[Path, ...] = (),
        orphan_dir_seconds: float = ORPHAN_DIR_SECONDS,
        batch_size: int = 500,
    ) -> None:
        self._pool = pool
        self._credits = credits
        self._prefix = prefix
        self._stale = requeue_stale_seconds
        self._dead = dead_worker_seconds
        self._settle_grace = settle_grace_seconds
        self._work_dirs = work_dirs
        self._orphan_age = orphan_dir_seconds
        self._batch = batch_size

    async def run_once(self) -> ReapResult:
        """One pass over the six steps; returns the counts. Logs only when it did something."""
        dead = await self._mark_dead_workers()
        requeued, failed, released = await self._expire_leases()
        promoted = await self._promote_retries()
        republished = await self._republish_stale()
        unsettled = await self._unsettled_holds()
        settled_holds = 0
        for job_id in released:
            try:
                await call(self._credits.Release, credits_pb2.ReleaseRequest(job_id=job_id))
            except DomainError:
                # The hold stays held; step 5 of a later run settles it.
                log.exception("could not release credits of a reaped job")
        for job_id, status, actual, lines in unsettled:
            try:
                if status == "completed":
                    response = await call(
                        self._credits.Commit, lifecycle.commit_request(job_id, actual or 0, lines)
                    )
                else:
                    response = await call(self._credits.Release, credits_pb2.ReleaseRequest(job_id=job_id))
            except DomainError:
                log.exception("could not settle the credits of an ended job")
                continue
            if not response.already_settled:
                settled_holds += 1
        removed_dirs = await self._remove_orphan_dirs()
        result = ReapResult(requeued, failed, promoted, republished, dead, settled_holds, removed_dirs)
        if result.anything:
            log.info("reaper run: %s", result)
        return result

    async def _expire_leases(self) -> tuple[int, int, list[str]]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                WITH expired AS (
                    SELECT job_id FROM processing_jobs
                    WHERE status IN ('claimed', 'processing', 'cancel_requested')
                      AND (visibility_timeout < now()
                           OR claimed_by IN (SELECT worker_id FROM workers WHERE status = 'dead'))
                    ORDER BY visibility_timeout LIMIT $1 FOR UPDATE SKIP LOCKED
                )
                UPDATE processing_jobs j SET
                    status = CASE WHEN j.status = 'cancel_requested' THEN 'cancelled'
                                  WHEN j.lost_attempts + 1 >= $2 THEN 'failed'
                                  ELSE 'queued' END,
                    error_code = CASE WHEN j.status <> 'cancel_requested' AND j.lost_attempts + 1 >= $2
                                      THEN 'WORKER_LOST' ELSE j.error_code END,
                    error_message = CASE WHEN j.status <> 'cancel_requested' AND j.lost_attempts + 1 >= $2
                                         THEN 'the job lost its worker too many times' ELSE j.error_message END,
                    completed_at = CASE WHEN j.status = 'cancel_requested' OR j.lost_attempts + 1 >= $2
                                        THEN now() END,
                    lost_attempts = j.lost_attempts + 1,
                    claimed_by = NULL, visibility_timeout = NULL, queued_at = now(), updated_at = now()
                FROM expired WHERE j.job_id = expired.job_id
                RETURNING j.job_id, j.status, j.queue, j.priority, j.attempt_count
                """,
                self._batch,
                lifecycle.MAX_LOST_ATTEMPTS,
            )
            await conn.executemany(
                """
                UPDATE job_attempts SET status = 'lost', error_code = 'WORKER_LOST',
                       error_message = 'worker lost: lease expired or worker dead', finished_at = now()
                WHERE job_id = $1 AND attempt_number = $2 AND status = 'processing'
                """,
                [(r["job_id"], r["attempt_count"]) for r in rows],
            )
            await self._enqueue(conn, [r for r in rows if r["status"] == "queued"])
        requeued = sum(1 for r in rows if r["status"] == "queued")
        released = [str(r["job_id"]) for r in rows if r["status"] != "queued"]
        return requeued, len(rows) - requeued, released

    async def _promote_retries(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                WITH due AS (
                    SELECT job_id FROM processing_jobs
                    WHERE status = 'retry_wait' AND next_attempt_at <= now()
                    ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED
                )
                UPDATE processing_jobs j SET status = 'queued', claimed_by = NULL, queued_at = now(),
                       updated_at = now()
                FROM due WHERE j.job_id = due.job_id
                RETURNING j.job_id, j.queue, j.priority
                """,
                self._batch,
            )
            await self._enqueue(conn, rows)
        return len(rows)

    async def _republish_stale(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                WITH stale AS (
                    SELECT job_id FROM processing_jobs
                    WHERE status = 'queued' AND queued_at < now() - make_interval(secs => $2)
                    ORDER BY queued_at LIMIT $1 FOR UPDATE SKIP LOCKED
                )
                UPDATE processing_jobs j SET queued_at = now(), updated_at = now()
                FROM stale WHERE j.job_id = stale.job_id
                RETURNING j.job_id, j.queue, j.priority
                """,
                self._batch,
                self._stale,
            )
            await self._enqueue(conn, rows)
        return len(rows)

    async def _enqueue(self, conn: db.Connection, rows: list[asyncpg.Record]) -> None:
        """The outbox rows of requeued jobs (``job_id``, ``queue``, ``priority``), in one round trip."""
        await lifecycle.enqueue_outbox_many(
            conn, self._prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows]
        )

    async def _unsettled_holds(self) -> list[tuple[str, str, int | None, dict[str, int]]]:
        rows = await self._pool.fetch(
            """
            SELECT h.job_id, j.status, j.actual_credits, j.charge_lines
            FROM credit_holds h LEFT JOIN processing_jobs j ON j.job_id = h.job_id
            WHERE h.status = 'held'
              AND ((j.status IN ('completed', 'failed', 'cancelled')
                    AND j.updated_at < now() - make_interval(secs => $2))
                   OR (j.job_id IS NULL AND h.created_at < now() - make_interval(secs => $2)))
            ORDER BY coalesce(j.updated_at, h.created_at) LIMIT $1
            """,
            self._batch,
            self._settle_grace,
        )
        return [(str(r["job_id"]), r["status"], r["actual_credits"], r["charge_lines"] or {}) for r in rows]

    async def _mark_dead_workers(self) -> int:
        result = await self._pool.execute(
            """
            UPDATE workers SET status = 'dead'
            WHERE status IN ('running', 'draining') AND last_heartbeat < now() - make_interval(secs => $1)
            """,
            self._dead,
        )
        return int(result.split()[-1])

    async def _remove_orphan_dirs(self) -> int:
        candidates: dict[str, list[Path]] = {}
        cutoff = time.time() - self._orphan_age
        for root in self._work_dirs:
            jobs = root / "jobs"
            for entry in jobs.iterdir() if jobs.is_dir() else ():
                try:
                    job_id = str(uuid.UUID(entry.name))
                    if entry.lstat().st_mtime > cutoff:
                        continue
                except (ValueError, OSError):
                    continue  # not a job directory, or gone already
                candidates.setdefault(job_id, []).append(entry)
        if not candidates:
            return 0
        running = {
            str(r["job_id"])
            for r in await self._pool.fetch(
                """
                SELECT job_id FROM processing_jobs
                WHERE job_id = ANY($1::uuid[]) AND status IN ('claimed', 'processing', 'cancel_requested')
                """,
                list(candidates),
            )
        }
        removed = 0
        for job_id, entries in candidates.items():
            if job_id in running:
                continue
            for entry in entries:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed += 1
        return removed
