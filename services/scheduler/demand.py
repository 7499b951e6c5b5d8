"""What the scheduler reads from Postgres each cycle (the truth, not the broker): the demand of
each queue, the expected work of a job of each operation, and the live workers.

The expected seconds of a job is an EWMA (α = :data:`EWMA_ALPHA`) of ``job_attempts.duration_ms``
of its operation's completed attempts, folded in as they finish (:class:`WorkEstimates`); an
operation with none yet counts the pool's ``default_job_seconds``. Where the operation's active
profile prices by size (``processing_profiles.per_mb > 0``: every operation but ``noop``), the
work scales with the input too: an EWMA of seconds per MiB of input, each job counting at least
:data:`MIN_MB` (a job has a fixed cost its size does not explain), so a backlog of 200 MB videos
weighs 200 times one of 1 MB files, and one of files under 1 MiB counts as the per-job EWMA does.
Pages are not known before a job runs (the engine's probe counts them); size stands in for them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from hypermedia.infra import db
from hypermedia.jobs.lifecycle import caps
from services.scheduler.formula import QueueDemand

EWMA_ALPHA = 0.1
"""Weight of the newest attempt: about the last 20 attempts carry 90 % of the estimate."""
BOOTSTRAP_SECONDS = 3600.0
"""A new leader folds in the attempts of the last hour before its first decision."""
FOLD_LIMIT = 20_000
"""Most attempts folded in one cycle (the rest the next)."""
MIN_MB = 1.0
"""A job counts at least this many MiB of input in the per-MB estimate."""
MB = f"greatest(o.size_bytes / 1048576.0, {MIN_MB})::float8"
"""The MiB a job counts (its object ``o``), in SQL."""

READY = "(status = 'queued' OR (status = 'retry_wait' AND next_attempt_at <= now()))"
RUNNING = caps.RUNNING
BAND = "CASE WHEN priority <= 3 THEN 'high' WHEN priority <= 7 THEN 'normal' ELSE 'low' END"


@dataclass
class WorkEstimates:
    """The EWMA of the completed attempts' ``duration_ms`` per operation, in seconds, and per MiB
    of input (``per_mb``, seconds per MiB, used for the operations in ``by_size``: their profile
    prices by size); kept by the leader in memory and brought up to date by :meth:`refresh` (a new
    leader starts from the last :data:`BOOTSTRAP_SECONDS`)."""

    seconds: dict[str, float] = field(default_factory=dict)
    per_mb: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    by_size: frozenset[str] = frozenset()
    watermark: dt.datetime | None = None

    async def refresh(self, conn: db.Connection) -> int:
        """Reads which operations scale by size and folds in the attempts completed since the
        last call; returns how many."""
        self.by_size = frozenset(
            r["operation"]
            for r in await conn.fetch(
                "SELECT DISTINCT operation FROM processing_profiles WHERE active AND per_mb > 0"
            )
        )
        since = self.watermark or (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=BOOTSTRAP_SECONDS))
        rows = await conn.fetch(
            f"""
            SELECT j.operation, a.duration_ms, a.finished_at, {MB} AS mb
            FROM job_attempts a JOIN processing_jobs j USING (job_id) JOIN objects o ON o.object_id = j.object_id
            WHERE a.status = 'completed' AND a.finished_at > $1 AND a.duration_ms IS NOT NULL
              -- a fanned-out job's attempts and its children's are parts of one job's work
              AND j.parent_job_id IS NULL AND j.fanned_out_at IS NULL
            ORDER BY a.finished_at LIMIT $2
            """,
            since,
            FOLD_LIMIT,
        )
        for row in rows:
            self.fold(row["operation"], row["duration_ms"] / 1000.0, row["mb"])
            self.watermark = row["finished_at"]
        return len(rows)

    def fold(self, operation: str, seconds: float, mb: float = MIN_MB) -> None:
        """One completed attempt of ``operation`` that took ``seconds`` on ``mb`` MiB of input
        (counted as at least :data:`MIN_MB`)."""
        old = self.seconds.get(operation)
        self.seconds[operation] = seconds if old is None else old + EWMA_ALPHA * (seconds - old)
        rate, old_rate = seconds / max(mb, MIN_MB), self.per_mb.get(operation)
        self.per_mb[operation] = rate if old_rate is None else old_rate + EWMA_ALPHA * (rate - old_rate)
        self.samples[operation] = self.samples.get(operation, 0) + 1

    def of(self, operation: str, default: float) -> float:
        """Expected seconds of one job of ``operation`` (``default`` before any attempt)."""
        return self.seconds.get(operation, default)

    def work(self, operation: str, jobs: int, mb: float, default: float) -> float:
        """Expected seconds of ``jobs`` jobs of ``operation`` with ``mb`` MiB of input in all
        (each counted as at least :data:`MIN_MB`): by size where the profile says so and an
        attempt was seen, else per job."""
        if operation in self.by_size and operation in self.per_mb:
            return mb * self.per_mb[operation]
        return jobs * self.of(operation, default)


async def queue_demand(
    conn: db.Connection,
    queues: Iterable[str],
    estimates: WorkEstimates,
    *,
    default_job_seconds: float,
    arrival_window_seconds: float,
) -> tuple[QueueDemand, ...]:
    """The demand of each of ``queues`` now (see :class:`QueueDemand`): ready jobs by operation
    and band (their expected work from ``estimates``), running jobs, and the jobs created in the
    last ``arrival_window_seconds``. The queued jobs an account's cap of running jobs holds are
    not ready (ADR 0060): more workers would not start them."""
    names = list(queues)
    ready = await conn.fetch(
        f"""
        WITH {caps.HELD}
        SELECT queue, operation, {BAND} AS band, count(*) AS n, sum({MB}) AS mb,
               extract(epoch FROM now() - min(coalesce(queued_at, j.created_at)))::float8 AS oldest
        FROM processing_jobs j JOIN objects o ON o.object_id = j.object_id
        WHERE queue = ANY($1::text[]) AND {READY}
          AND NOT EXISTS (SELECT 1 FROM held h WHERE h.job_id = j.job_id)
        GROUP BY 1, 2, 3
        """,
        names,
    )
    running = await conn.fetch(
        f"SELECT queue, count(*) AS n FROM processing_jobs WHERE queue = ANY($1::text[]) AND {RUNNING} GROUP BY 1",
        names,
    )
    arrived = await conn.fetch(
        f"""
        SELECT queue, operation, count(*) AS n, sum({MB}) AS mb
        FROM processing_jobs j JOIN objects o ON o.object_id = j.object_id
        WHERE j.created_at > now() - make_interval(secs => $2) AND queue = ANY($1::text[])
        GROUP BY 1, 2
        """,
        names,
        arrival_window_seconds,
    )
    out = []
    for queue in names:
        bands: dict[str, int] = {}
        backlog = 0.0
        oldest = 0.0
        for row in (r for r in ready if r["queue"] == queue):
            bands[row["band"]] = bands.get(row["band"], 0) + row["n"]
            backlog += estimates.work(row["operation"], row["n"], row["mb"], default_job_seconds)
            oldest = max(oldest, row["oldest"] or 0.0)
        arrivals = [r for r in arrived if r["queue"] == queue]
        out.append(
            QueueDemand(
                queue=queue,
                ready=sum(bands.values()),
                ready_by_band=bands,
                running=sum(r["n"] for r in running if r["queue"] == queue),
                backlog_work_seconds=backlog,
                arrival_per_second=sum(r["n"] for r in arrivals) / arrival_window_seconds,
                arrival_work_rate=sum(
                    estimates.work(r["operation"], r["n"], r["mb"], default_job_seconds) for r in arrivals
                )
                / arrival_window_seconds,
                oldest_ready_seconds=oldest,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class LiveWorker:
    """A ``workers`` row that is ``running`` or ``draining``: its slots (control's admission target
    when its latest ``worker_metrics`` sample has one), the jobs it holds now, its heartbeat's age
    and the burst worker it runs for (None: a standing worker)."""

    worker_id: str
    queue: str
    slots: int
    status: str
    burst_worker_id: str | None
    heartbeat_age_seconds: float
    running_jobs: int


async def live_workers(conn: db.Connection, queues: Iterable[str]) -> list[LiveWorker]:
    """The running and draining workers of ``queues`` (see :class:`LiveWorker`)."""
    rows = await conn.fetch(
        f"""
        WITH held AS (
            SELECT claimed_by, count(*) AS n FROM processing_jobs WHERE {RUNNING} GROUP BY claimed_by
        )
        SELECT w.worker_id, w.queue, coalesce(m.admission_target, w.slots) AS slots, w.status,
               w.burst_worker_id::text AS burst_worker_id,
               extract(epoch FROM now() - w.last_heartbeat)::float8 AS heartbeat_age,
               coalesce(h.n, 0) AS running_jobs
        FROM workers w
        LEFT JOIN held h ON h.claimed_by = w.worker_id
        LEFT JOIN LATERAL (
            SELECT admission_target FROM worker_metrics wm WHERE wm.worker_id = w.worker_id
            ORDER BY recorded_at DESC LIMIT 1
        ) m ON true
        WHERE w.status IN ('running', 'draining') AND w.queue = ANY($1::text[])
        """,
        list(queues),
    )
    return [
        LiveWorker(
            r["worker_id"],
            r["queue"],
            r["slots"],
            r["status"],
            r["burst_worker_id"],
            r["heartbeat_age"],
            r["running_jobs"],
        )
        for r in rows
    ]
