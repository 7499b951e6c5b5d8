"""The reaper: the safety net under the job lifecycle. A loop around :meth:`Reaper.run_once`.

Each run, in one transaction per step, with ``FOR UPDATE SKIP LOCKED`` so several replicas never
requeue the same job twice:

1. **dead workers**: workers whose heartbeat is older than ``dead_worker_seconds`` are marked dead;
2. **lost leases**: jobs in ``claimed``/``processing``/``cancel_requested`` whose
   ``visibility_timeout`` passed, or whose worker is dead, go back to ``queued`` (published again),
   or to ``failed`` with ``WORKER_LOST`` once they lost :data:`lifecycle.MAX_LOST_ATTEMPTS`
   attempts (``cancelled`` when cancellation was requested). A dead worker's jobs are recovered at once, not when their leases run out;
   the holds of the jobs this step ended are released together, in one ``Settle`` call;
3. **retry promotion**: ``retry_wait`` jobs whose ``next_attempt_at`` passed go to ``queued``;
4. **stale queued**: jobs ``queued`` longer than ``requeue_stale_seconds`` are published again, so
   a message the broker lost never strands a job (claims are idempotent, duplicates are dropped);
5. **unsettled holds**: jobs whose credit hold is still ``held`` more than ``settle_grace_seconds``
   after they ended — a Release or Commit that failed or was never made (the credits service was
   unreachable, or a process died between the job's transition and the call): ``completed`` jobs,
   and ``failed`` ones that recorded a charge (their input's fault, ADR 0068), are charged their
   ``actual_credits`` (with their ``charge_lines``), other ``failed`` and ``cancelled`` ones released; a hold
   whose job was never created (the gateway died, or could not reach Postgres, between Hold and
   the job's transaction, and its own Release failed too) is released;
6. **orphaned job directories** (when given ``work_dirs``, the workers' ``HM_WORK_DIR`` on this
   machine): a ``jobs/{job_id}/`` directory older than ``orphan_dir_seconds`` whose job is not
   running any more is removed — what a worker that died and never came back left behind. (A
   worker also sweeps its own directory when it starts; on Kubernetes a pod's emptyDir goes with it.)

The reaper decides; :mod:`hypermedia.jobs.lifecycle` writes every transition (steps 2–4, with the
one rule for a lost attempt) and :mod:`hypermedia.jobs.settlement` settles credits (step 5 asks the
credits service for its held holds over gRPC and settles each page of them in one ``Settle`` call;
settling is idempotent per job, so settling a hold someone else is settling at the same moment is
harmless).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.core.errors import DomainError
from hypermedia.jobs import lifecycle
from hypermedia.jobs.settlement import MAX_SETTLE, Settlement, settle_request

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
    directories on this machine whose orphaned job directories step 6 removes (none: step off);
    ``batch_size``: rows a step takes per run, 1 to :data:`MAX_SETTLE` (a step's holds are settled
    in one ``Settle`` call). Raises ValueError for a batch size out of that range."""

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
        if not 1 <= batch_size <= MAX_SETTLE:
            raise ValueError(f"batch_size must be 1 to {MAX_SETTLE}, not {batch_size}")
        self._pool = pool
        self._settlement = Settlement(credits)
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
        expired = await lifecycle.expire_leases(self._pool, self._prefix, self._batch)
        requeued = sum(1 for _, status in expired if status == "queued")
        if ended := [settle_request(job_id, status) for job_id, status in expired if status != "queued"]:
            try:  # at most batch_size ≤ MAX_SETTLE jobs: one call
                await self._settlement.settle_many(ended)
            except DomainError:
                # The holds stay held; step 5 of a later run settles them.
                log.exception("could not release the credits of %d reaped jobs", len(ended))
        promoted = await lifecycle.promote_retries(self._pool, self._prefix, self._batch)
        republished = await lifecycle.republish_stale(self._pool, self._prefix, self._batch, self._stale)
        try:
            settled_holds = await self._settlement.sweep(self._pool, self._settle_grace, self._batch)
        except DomainError:
            log.exception("could not list the held credits (the credits service is unreachable)")
            settled_holds = 0
        removed_dirs = await self._remove_orphan_dirs()
        result = ReapResult(
            requeued, len(expired) - requeued, promoted, republished, dead, settled_holds, removed_dirs
        )
        if result.anything:
            log.info("reaper run: %s", result)
        return result

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
