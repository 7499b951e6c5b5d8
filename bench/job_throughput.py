"""Job-system throughput with no-op jobs (issue 17's P6): create → completed per second, and the
claim latency as the queue grows, against raw asyncpg + nats-py doing the same minimal work in
the same run.

    .venv/bin/python bench/job_throughput.py [--count 2000] [--workers 1,2] [--depths 10,1000,10000]
                                             [--probes 40] [--submitters 4] [--logs DIR]

The ``noop`` operation (ADR 0038) is enabled on a private platform (``HM_NOOP_OPERATION=1``,
``HM_MAX_OPERATIONS=100``: one process request creates 100 jobs, the API's batch); the services
are credits, storage and gateway, and the benchmark starts and stops the imageworkers itself.

* **Claim latency at depth Q** (10, 1,000, 10,000 queued): with no worker running, the queue is
  filled to Q through REST, then this process claims jobs exactly as a worker's fetch loop does
  (``queues.PriorityFetcher.next`` → ``lifecycle.claim`` → ``ack``), timing each claim, at most
  Q/2 before the queue is filled to Q again. The claimed jobs are completed through
  ``lifecycle.complete`` (not timed). The raw baseline: a table with a status column and a
  JetStream stream with one durable pull consumer, filled to Q, each claim a pull of one message
  + ``UPDATE … WHERE status = 'queued'`` + ack.
* **Backlog drain**: the jobs still queued after the deepest probe are drained by the largest
  number of workers: jobs/s from the first claim to the last completion.
* **End to end, 1…N workers**: ``--count`` jobs created by ``--submitters`` concurrent clients
  (100 operations per request) while W warm imageworkers (4 slots each) run them; jobs/s from
  the first POST to the last ``completed_at``, and created → completed p50/p99. The raw
  baseline: W consumer tasks (pull, claim UPDATE, ack, complete UPDATE) while a producer inserts
  rows 100 per transaction and publishes their messages, in this one process.

**Goals (issue 17, P6):** ≥ 500 jobs/s end to end; p50 claim latency at 10,000 queued ≤ 2× the
p50 at 10. Ratios are platform / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common  # noqa: E402

GOAL_JOBS_PER_SECOND = 500.0
GOAL_FLATNESS = 2.0
"""p50 claim latency at the deepest queue / at the shallowest: at most this."""
BATCH = 100
"""Operations per process request (``HM_MAX_OPERATIONS``)."""
SLOTS = 4
SERVICES = "credits,storage,gateway"
PHOTO = REPO / "tests" / "data" / "exif-orientation" / "Landscape_1.jpg"
UID_BASE = 660000
FAKE_WORKER = "bench/claimer"


# -- the platform side -----------------------------------------------------------------------


async def create_jobs(bp: common.BenchPlatform, object_id: str, count: int, submitters: int) -> list[str]:
    """``count`` noop jobs through ``POST /v1/hypermedia/process``, :data:`BATCH` per request,
    ``submitters`` requests at once; returns their ids."""
    sizes = [BATCH] * (count // BATCH) + ([count % BATCH] if count % BATCH else [])
    ids: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for size in sizes:
        queue.put_nowait(size)
    headers = {"Authorization": f"Bearer {bp.account['api_key']}"}
    async with httpx.AsyncClient(base_url=bp.platform.rest_url, headers=headers, timeout=120) as client:

        async def submitter() -> None:
            while not queue.empty():
                size = queue.get_nowait()
                response = await client.post(
                    "/v1/hypermedia/process", json={"object_id": object_id, "operations": ["noop"] * size}
                )
                if response.status_code != 202:
                    raise RuntimeError(f"process answered {response.status_code}: {response.text}")
                ids.extend(response.json()["job_ids"])

        await asyncio.gather(*(submitter() for _ in range(submitters)))
    return ids


async def wait_published(pool: Any, timeout: float = 300) -> None:
    """Until the outbox relay has published every row it may: rows deferred by an account's
    window (ADR 0059) wait for claims, so a queue of Q jobs of the one account has
    ``FAIR_WINDOW`` messages on the stream and the rest in Postgres."""
    deadline = time.monotonic() + timeout
    while await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL AND NOT deferred"):
        if time.monotonic() > deadline:
            raise TimeoutError("outbox not published")
        await asyncio.sleep(0.02)


async def wait_completed(pool: Any, job_ids: Sequence[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = await pool.fetchval(
            "SELECT count(*) FROM processing_jobs WHERE job_id = ANY($1::uuid[]) "
            "AND status IN ('completed', 'failed', 'cancelled')",
            list(job_ids),
        )
        if done == len(job_ids):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(job_ids) - done} jobs not finished")
        await asyncio.sleep(0.02)


async def platform_claims(
    bp: common.BenchPlatform, pool: Any, object_id: str, depths: Sequence[int], probes: int, submitters: int
) -> dict[int, list[float]]:
    """Per depth, the ms of each claim (fetch → claim → ack) taken by this process as a worker's
    fetch loop takes it, the queue filled to the depth before every Q/2 claims."""
    from hypermedia.jobs import lifecycle, queues

    env = bp.platform.env
    nc, _js = await queues.connect(env["HM_NATS_URL"], "bench-claimer")
    fetcher = queues.PriorityFetcher(nc, env["HM_STREAM_PREFIX"], "images")
    await fetcher.start()
    stop = asyncio.Event()
    samples: dict[int, list[float]] = {}
    try:
        for depth in depths:
            samples[depth] = []
            while len(samples[depth]) < probes:
                queued = await pool.fetchval("SELECT count(*) FROM processing_jobs WHERE status = 'queued'")
                if depth > queued:
                    await create_jobs(bp, object_id, depth - queued, submitters)
                    await wait_published(pool)
                claimed = []
                for _ in range(min(max(1, depth // 2), probes - len(samples[depth]))):
                    started = time.perf_counter()
                    msg = await fetcher.next(stop)
                    assert msg is not None
                    job = await lifecycle.claim(pool, queues.JobMessage.decode(msg.data).job_id, FAKE_WORKER)
                    await msg.ack()
                    samples[depth].append((time.perf_counter() - started) * 1000)
                    if job is not None:
                        claimed.append(job)
                for job in claimed:
                    await lifecycle.complete(pool, job, FAKE_WORKER, [], 0, 0, 0)
    finally:
        await fetcher.stop()
        await nc.close()
    return samples


@contextlib.contextmanager
def workers(bp: common.BenchPlatform, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` imageworkers (:data:`SLOTS` slots, noop enabled) started and registered; stopped
    with SIGTERM at the end."""
    import psycopg

    procs = []
    try:
        for i in range(count):
            env = bp.platform.service_env() | {
                "HM_WORKER_SLOTS": str(SLOTS),
                "HM_NOOP_OPERATION": "1",
                "HM_WORK_DIR": str(bp.platform.state_dir / f"bench-work-{i}"),
                "HM_SANDBOX_UID_BASE": str(UID_BASE + 64 * i),
            }
            log = (bp.platform.state_dir / "logs" / f"bench-imageworker-{i}.log").open("ab")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "services.imageworker"], env=env, cwd=REPO, stdout=log, stderr=log
                )
            )
        deadline = time.monotonic() + 120
        with psycopg.connect(bp.dsn, autocommit=True) as conn:
            for proc in procs:
                query = "SELECT 1 FROM workers WHERE pid = %s AND status = 'running'"
                while not conn.execute(query, (proc.pid,)).fetchone():
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("a benchmark imageworker did not start")
                    time.sleep(0.1)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _cpu(procs: Sequence[subprocess.Popen[bytes]]) -> float:
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(proc.pid)
            for q in [p, *p.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
    return total


async def platform_throughput(
    bp: common.BenchPlatform, pool: Any, object_id: str, count: int, submitters: int, procs: Sequence[Any]
) -> dict[str, Any]:
    """``count`` jobs created and run while the workers run: jobs/s from the first POST to the
    last ``completed_at`` (the database's clock for both ends), latencies, CPU per job."""
    before, workers_before = common.cpu_snapshot(bp), _cpu(procs)
    started = await pool.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    ids = await create_jobs(bp, object_id, count, submitters)
    await wait_completed(pool, ids)
    cpu = common.cpu_delta(before, common.cpu_snapshot(bp))
    cpu["imageworkers"] = _cpu(procs) - workers_before
    rows = await pool.fetch(
        "SELECT status, extract(epoch FROM created_at)::float8 AS created, "
        "extract(epoch FROM completed_at)::float8 AS completed FROM processing_jobs WHERE job_id = ANY($1::uuid[])",
        ids,
    )
    bad = [r["status"] for r in rows if r["status"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} jobs did not complete: {sorted(set(bad))}")
    last = max(r["completed"] for r in rows)
    latencies = [(r["completed"] - r["created"]) * 1000 for r in rows]
    return {
        "jobs_per_second": count / (last - started),
        "latency_p50_ms": common.percentile(latencies, 50),
        "latency_p99_ms": common.percentile(latencies, 99),
        "cpu_ms_per_job": {k: v * 1000 / count for k, v in cpu.items() if v > 0.005},
    }


async def drain_backlog(pool: Any) -> tuple[int, float]:
    """Waits until no job is queued; returns how many were and jobs/s from the first claim of
    them to the last completion."""
    ids = [
        r["job_id"] for r in await pool.fetch("SELECT job_id FROM processing_jobs WHERE status = 'queued'")
    ]
    if not ids:
        return 0, 0.0
    await wait_completed(pool, ids)
    first, last = await pool.fetchrow(
        "SELECT extract(epoch FROM min(a.started_at))::float8, extract(epoch FROM max(j.completed_at))::float8 "
        "FROM processing_jobs j JOIN job_attempts a USING (job_id) WHERE j.job_id = ANY($1::uuid[])",
        ids,
    )
    return len(ids), len(ids) / (last - first)


# -- the raw baseline: asyncpg + nats-py, nothing else ---------------------------------------


class Raw:
    """The least a job system does: a row per job with a status, a JetStream message per job,
    a claim that is a conditional UPDATE, an ack, a completion UPDATE."""

    def __init__(self, pool: Any, nats_url: str) -> None:
        self.pool = pool
        self.nats_url = nats_url
        self.stream = "RAWBENCH" + uuid.uuid4().hex[:6].upper()
        self.subject = self.stream.lower() + ".jobs"

    async def __aenter__(self) -> Raw:
        import nats
        from nats.js import api

        self.nc = await nats.connect(self.nats_url)
        self.js = self.nc.jetstream()
        await self.js.add_stream(
            api.StreamConfig(
                name=self.stream,
                subjects=[self.subject],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
            )
        )
        await self.js.add_consumer(
            self.stream,
            api.ConsumerConfig(
                durable_name="raw", ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=100_000
            ),
        )
        self.sub = await self.js.pull_subscribe(self.subject, "raw", stream=self.stream)
        await self.pool.execute(
            "CREATE TABLE IF NOT EXISTS raw_jobs (job_id uuid PRIMARY KEY, status text NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT clock_timestamp(), completed_at timestamptz)"
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.js.delete_stream(self.stream)
        await self.nc.close()

    async def create(self, count: int) -> None:
        """``count`` rows, :data:`BATCH` per transaction, each batch's messages published after its commit."""
        for start in range(0, count, BATCH):
            ids = [uuid.uuid4() for _ in range(min(BATCH, count - start))]
            await self.pool.executemany(
                "INSERT INTO raw_jobs (job_id, status) VALUES ($1, 'queued')", [(i,) for i in ids]
            )
            await asyncio.gather(
                *(
                    self.js.publish(self.subject, str(i).encode(), headers={"Nats-Msg-Id": str(i)})
                    for i in ids
                )
            )

    async def claim(self) -> str | None:
        msgs = await self.sub.fetch(1, timeout=5)
        job_id = msgs[0].data.decode()
        won = await self.pool.fetchval(
            "UPDATE raw_jobs SET status = 'claimed' WHERE job_id = $1 AND status = 'queued' RETURNING 1",
            job_id,
        )
        await msgs[0].ack()
        return job_id if won else None

    async def complete(self, job_id: str) -> None:
        await self.pool.execute(
            "UPDATE raw_jobs SET status = 'completed', completed_at = clock_timestamp() WHERE job_id = $1",
            job_id,
        )

    async def queued(self) -> int:
        return int(await self.pool.fetchval("SELECT count(*) FROM raw_jobs WHERE status = 'queued'"))

    async def claims(self, depths: Sequence[int], probes: int) -> dict[int, list[float]]:
        samples: dict[int, list[float]] = {}
        for depth in depths:
            samples[depth] = []
            while len(samples[depth]) < probes:
                await self.create(max(0, depth - await self.queued()))
                for _ in range(min(max(1, depth // 2), probes - len(samples[depth]))):
                    started = time.perf_counter()
                    job_id = await self.claim()
                    samples[depth].append((time.perf_counter() - started) * 1000)
                    if job_id:
                        await self.complete(job_id)
        # what is left goes at once: the throughput run starts from an empty queue
        await self.js.purge_stream(self.stream)
        await self.pool.execute("DELETE FROM raw_jobs")
        return samples

    async def throughput(self, count: int, consumers: int) -> float:
        """jobs/s: ``consumers`` × :data:`SLOTS` tasks claim and complete while the producer
        creates ``count``; the clock stops at the last completion (the idle consumers' last
        fetch then times out)."""
        done = 0
        started = time.perf_counter()

        async def consumer() -> None:
            nonlocal done
            while done < count:
                try:
                    job_id = await self.claim()
                except TimeoutError:
                    continue
                if job_id:
                    await self.complete(job_id)
                    done += 1
                    if done == count:
                        finished.append(time.perf_counter())

        finished: list[float] = []
        await asyncio.gather(self.create(count), *(consumer() for _ in range(consumers * SLOTS)))
        return count / (finished[0] - started)


# -- the run ---------------------------------------------------------------------------------


def _p(values: Sequence[float], q: float) -> float:
    return common.percentile(values, q)


async def _measure(
    bp: common.BenchPlatform,
    count: int,
    worker_counts: Sequence[int],
    depths: Sequence[int],
    probes: int,
    submitters: int,
) -> dict[str, Any]:
    import asyncpg

    with httpx.Client(
        base_url=bp.platform.rest_url, headers={"Authorization": f"Bearer {bp.account['api_key']}"}
    ) as client:
        object_id = common.upload(client, PHOTO)["object_id"]
    pool = await asyncpg.create_pool(bp.dsn, min_size=2, max_size=8, init=_json_codecs)
    try:
        claims = await platform_claims(bp, pool, object_id, depths, probes, submitters)
        with workers(bp, max(worker_counts)) as procs:
            backlog, drain_jps = await drain_backlog(pool)
        runs: dict[int, dict[str, Any]] = {}
        for w in worker_counts:
            with workers(bp, w) as procs:
                await platform_throughput(bp, pool, object_id, min(count, 200), submitters, procs)  # warm-up
                noise = common.Background().start()
                runs[w] = await platform_throughput(bp, pool, object_id, count, submitters, procs)
                runs[w]["background_cores"] = noise.stop().cores
        async with Raw(pool, bp.platform.env["HM_NATS_URL"]) as raw:
            raw_claims = await raw.claims(depths, probes)
            raw_runs = {w: await raw.throughput(count, w) for w in worker_counts}
    finally:
        await pool.close()
    return {
        "claims": claims,
        "raw_claims": raw_claims,
        "backlog": backlog,
        "drain_jps": drain_jps,
        "runs": runs,
        "raw_runs": raw_runs,
    }


async def _json_codecs(conn: Any) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


def run(
    count: int = 2000,
    worker_counts: Sequence[int] = (1, 2),
    depths: Sequence[int] = (10, 1000, 10000),
    probes: int = 40,
    submitters: int = 4,
    keep_logs: Path | None = None,
    verbose: bool = True,
) -> dict[str, Any]:
    """Runs the whole benchmark; returns the figures (also printed when ``verbose``): ``jobs_per_second``
    (the best W), ``flatness`` (p50 claim at the deepest / the shallowest depth), ``met``."""
    say = print if verbose else (lambda *a, **k: None)
    root = common.temp_root("hm-bench-jt-")
    try:
        say(
            f"job throughput: noop jobs, {count} per run, workers {list(worker_counts)} x {SLOTS} slots, "
            f"claim latency at {list(depths)} queued, {common.machine()}"
        )
        env = {"HM_NOOP_OPERATION": "1", "HM_MAX_OPERATIONS": str(BATCH)}
        with common.running_platform(
            root / "platform", keep_logs=keep_logs, env=env, services=SERVICES
        ) as bp:
            m = asyncio.run(_measure(bp, count, worker_counts, depths, probes, submitters))
        claim_rows = []
        for depth in depths:
            ours, raw = m["claims"][depth], m["raw_claims"][depth]
            claim_rows.append(
                (
                    f"{depth:,} queued",
                    _p(raw, 50),
                    _p(ours, 50),
                    _p(ours, 90),
                    _p(ours, 99),
                    f"{_p(ours, 50) / _p(raw, 50):.1f}x",
                )
            )
        say("claim latency, ms (fetch -> claim -> ack, one at a time):")
        say(common.table(claim_rows, ("depth", "raw p50", "platform p50", "p90", "p99", "platform/raw")))
        flatness = _p(m["claims"][depths[-1]], 50) / _p(m["claims"][depths[0]], 50)
        raw_flatness = _p(m["raw_claims"][depths[-1]], 50) / _p(m["raw_claims"][depths[0]], 50)
        rows = []
        for w in worker_counts:
            r = m["runs"][w]
            rows.append(
                (
                    f"{w} worker{'s' if w > 1 else ''}",
                    m["raw_runs"][w],
                    r["jobs_per_second"],
                    f"{r['jobs_per_second'] / m['raw_runs'][w]:.2f}x",
                    r["latency_p50_ms"],
                    r["latency_p99_ms"],
                    f"{r['background_cores']:.2f}",
                )
            )
        say("end to end, create -> completed:")
        say(
            common.table(
                rows, ("workers", "raw jobs/s", "platform jobs/s", "ratio", "p50 ms", "p99 ms", "bg cores")
            )
        )
        say(
            f"  backlog of {m['backlog']:,} queued drained by {max(worker_counts)} workers at {m['drain_jps']:.0f} jobs/s"
        )
        best_w = max(worker_counts, key=lambda w: m["runs"][w]["jobs_per_second"])
        cpu = m["runs"][best_w]["cpu_ms_per_job"]
        say(f"  CPU ms per job ({best_w} workers): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
        best = m["runs"][best_w]["jobs_per_second"]
        results = {
            "jobs_per_second": best,
            "raw_jobs_per_second": m["raw_runs"][best_w],
            "best_workers": best_w,
            "flatness": flatness,
            "raw_flatness": raw_flatness,
            "claim_p50_ms": {d: _p(m["claims"][d], 50) for d in depths},
            "raw_claim_p50_ms": {d: _p(m["raw_claims"][d], 50) for d in depths},
            "runs": m["runs"],
            "raw_runs": m["raw_runs"],
            "drain_jps": m["drain_jps"],
            "throughput_met": best >= GOAL_JOBS_PER_SECOND,
            "flat_met": flatness <= GOAL_FLATNESS,
            "depths": list(depths),
        }
        say(
            f"  => P6 {best:.0f} jobs/s (goal >= {GOAL_JOBS_PER_SECOND:.0f}: "
            f"{'MET' if results['throughput_met'] else 'MISSED'}); raw asyncpg + nats-py {m['raw_runs'][best_w]:.0f} jobs/s; "
            f"claim p50 at {depths[-1]:,} / at {depths[0]:,} queued {flatness:.2f}x (goal <= {GOAL_FLATNESS:g}x: "
            f"{'MET' if results['flat_met'] else 'MISSED'}; raw {raw_flatness:.2f}x)"
        )
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=2000, help="jobs per end-to-end run (default 2000)")
    parser.add_argument("--workers", default="1,2", help="imageworker counts, comma-separated (default 1,2)")
    parser.add_argument("--depths", default="10,1000,10000", help="queue depths of the claim probes")
    parser.add_argument("--probes", type=int, default=40, help="claims timed per depth (default 40)")
    parser.add_argument("--submitters", type=int, default=4, help="concurrent REST clients (default 4)")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platform's service logs here")
    args = parser.parse_args(argv)
    run(
        args.count,
        [int(w) for w in args.workers.split(",")],
        [int(d) for d in args.depths.split(",")],
        args.probes,
        args.submitters,
        args.logs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
