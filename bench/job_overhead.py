"""Per-job overhead: a tiny job (64×64 PNG → 32-px WebP thumbnail), one at a time.

    .venv/bin/python bench/job_overhead.py [--count 100] [--poll-ms 5] [--logs DIR]

Baselines, in one warm spawned process (never in this one, which starts the platform):

* ``bare``: ``Image.thumbnail(png, 32).webpsave(out)``, median per operation;
* ``pipeline``: the platform's own entry ``hypermedia.engines.imaging.ops.run`` (sniff, header check,
  thumbnail with sRGB output, save without metadata) — what a sandbox child runs, without the fork;
* ``sandbox``: the same entry through :class:`hypermedia.sandbox.Sandbox` (zygote → forked,
  rlimited child per job), one at a time, measured from this process.

Platform: embedded Postgres + NATS + ``hypermedia up``; three warm-up jobs; then ``--count`` jobs
submitted one after another, each ``POST /v1/hypermedia/process`` then ``GET /v1/jobs/{id}`` every
``--poll-ms`` until it ended. Reported as p50/p99:

* **client**: POST sent → the GET that shows ``completed`` (what a caller sees; includes the polling);
* **created→completed**: the job's own timestamps (both Postgres ``now()``: the gateway's insert
  transaction and the worker's completion transaction), split into **queue** (created → the
  worker's claim, ``job_attempts.started_at``: outbox relay, JetStream publish, doorbell, priority
  sweep, claim) and **attempt** (claim → completion: GetObject, presigned download, sandbox, presigned
  upload, RegisterOutput, complete), of which **child** is the sandbox child (fork → exit);
* **POST**: the process request alone (estimate + hold over gRPC, insert, outbox row).

Prints the ratio and the difference platform − baseline.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, vipswork  # noqa: E402

SIZE = 32
TERMINAL = ("completed", "failed", "cancelled")


def baselines(root: Path, count: int) -> tuple[Path, dict[str, Any]]:
    """Makes the PNG and measures the in-process per-op times in one spawned process."""
    png = root / "tiny.png"
    with vipswork.vips_pool(1, 1) as pool:
        pool.submit(vipswork.make_tiny_png, str(png)).result()
        times = pool.submit(
            vipswork.per_op_times, str(png), str(root / "out"), SIZE, max(count, 200)
        ).result()
    return png, times


def platform_jobs(
    bp: common.BenchPlatform, png: Path, count: int, poll_s: float
) -> tuple[list[dict[str, Any]], common.Background]:
    rows: list[dict[str, Any]] = []
    with bp.client() as client:
        obj = common.upload(client, png)["object_id"]
        for _ in range(3):  # warm-up: connections, pools, the zygote's first fork
            common.wait_all_terminal(bp.dsn, [common.submit_thumbnail(client, obj, SIZE)], timeout=60)
        noise = common.Background().start()
        for _ in range(count):
            started = time.perf_counter()
            job_id = common.submit_thumbnail(client, obj, SIZE)
            posted = time.perf_counter()
            while True:
                job = client.get(f"/v1/jobs/{job_id}").json()
                if job["status"] in TERMINAL:
                    break
                time.sleep(poll_s)
            seen = time.perf_counter()
            if job["status"] != "completed":
                raise RuntimeError(f"job {job_id} {job['status']}: {job.get('error_code')}")
            created, completed = common.iso_epoch(job["created_at"]), common.iso_epoch(job["completed_at"])
            assert created is not None and completed is not None
            rows.append(
                {
                    "job_id": job_id,
                    "client_ms": (seen - started) * 1000,
                    "post_ms": (posted - started) * 1000,
                    "created_completed_ms": (completed - created) * 1000,
                }
            )
        noise.stop()
    for row, t in zip(rows, common.job_timings(bp.dsn, [r["job_id"] for r in rows]), strict=True):
        row["queue_ms"] = (t["attempt_started"] - t["created"]) * 1000
        row["attempt_ms"] = (t["completed"] - t["attempt_started"]) * 1000
        row["child_ms"] = float(t["child_ms"])
        row["retries"] = t["attempt_count"] - 1
    return rows, noise


def probe(bp: common.BenchPlatform, job_id: str, repeats: int = 50) -> dict[str, float]:
    """p50 (ms) of the single steps a job is made of, called from here against the running
    platform: one Postgres round trip, one gRPC call to credits and to storage, a REST GET of a
    job, and a presigned download of its output through the storage HTTP server."""
    import asyncio

    import asyncpg

    from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
    from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
    from hypermedia.infra import rpc

    info = bp.platform.info
    account_id = bp.account["account_id"]

    async def timed(fn: Any) -> float:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            await fn()
            samples.append((time.perf_counter() - started) * 1000)
        return common.percentile(samples, 50)

    async def measure() -> dict[str, float]:
        conn = await asyncpg.connect(bp.dsn)
        # As the gateway calls them (mutual TLS with its certificate, ADR 0044; plaintext under
        # HM_INTERNAL_AUTH=none).
        tls = bp.platform.tls("gateway") if info.get("internal_auth") == "mtls" else None
        credits_chan = rpc.channel(info["credits_addr"], tls, "credits")
        storage_chan = rpc.channel(info["storage_addr"], tls, "storage")
        try:
            credits = credits_pb2_grpc.CreditsServiceStub(credits_chan)
            storage = storage_pb2_grpc.StorageServiceStub(storage_chan)
            key = await conn.fetchval("SELECT key FROM job_outputs WHERE job_id = $1", uuid.UUID(job_id))
            url = (await rpc.call(storage.PresignGet, storage_pb2.PresignGetRequest(key=key))).url
            async with httpx.AsyncClient(base_url=bp.platform.rest_url) as http:
                headers = {"Authorization": f"Bearer {bp.account['api_key']}"}
                return {
                    "postgres_roundtrip_ms": await timed(lambda: conn.fetchval("SELECT 1")),
                    "grpc_credits_getbalance_ms": await timed(
                        lambda: rpc.call(
                            credits.GetBalance, credits_pb2.GetBalanceRequest(account_id=account_id)
                        )
                    ),
                    "grpc_storage_presignget_ms": await timed(
                        lambda: rpc.call(storage.PresignGet, storage_pb2.PresignGetRequest(key=key))
                    ),
                    "rest_get_job_ms": await timed(lambda: http.get(f"/v1/jobs/{job_id}", headers=headers)),
                    "presigned_download_ms": await timed(lambda: http.get(url)),
                }
        finally:
            await conn.close()
            await credits_chan.close()
            await storage_chan.close()

    return asyncio.run(measure())


def run(
    count: int = 100,
    poll_ms: float = 5.0,
    keep_logs: Path | None = None,
    verbose: bool = True,
    internal_auth: str = "mtls",
) -> dict[str, Any]:
    """Runs the whole benchmark; returns the figures (also printed when ``verbose``).
    ``internal_auth``: the platform's ``HM_INTERNAL_AUTH`` (``mtls``, as shipped, or ``none``)."""
    from bench import sandboxed

    say = print if verbose else (lambda *a, **k: None)
    root = common.temp_root("hm-bench-oh-")
    try:
        say(
            f"job overhead: {count} sequential 64x64 PNG -> {SIZE}px WebP jobs, poll {poll_ms:g} ms, "
            f"internal gRPC {internal_auth}, {common.machine()}"
        )
        png, base = baselines(root, count)
        sb = sandboxed.run_sequential(root / "sandbox-work", png, SIZE, count)
        with common.running_platform(
            root / "platform", keep_logs=keep_logs, env={"HM_INTERNAL_AUTH": internal_auth}
        ) as bp:
            rows, noise = platform_jobs(bp, png, count, poll_ms / 1000)
            steps = probe(bp, rows[-1]["job_id"])

        def p(key: str, q: float) -> float:
            return common.percentile([r[key] for r in rows], q)

        results: dict[str, Any] = {
            "count": count,
            "poll_ms": poll_ms,
            "bare_ms": base["bare_ms"],
            "pipeline_ms": base["pipeline_ms"],
            "bare_p99_ms": base["bare_p99_ms"],
            "sandbox_p50_ms": common.percentile(sb["per_job_ms"], 50),
            "sandbox_p99_ms": common.percentile(sb["per_job_ms"], 99),
            "sandbox_child_p50_ms": common.percentile(sb["child_ms"], 50),
            "background_cores": noise.cores,
            "retries": sum(r["retries"] for r in rows),
        }
        for key in ("client_ms", "created_completed_ms", "queue_ms", "attempt_ms", "child_ms", "post_ms"):
            results[f"{key[:-3]}_p50_ms"] = p(key, 50)
            results[f"{key[:-3]}_p99_ms"] = p(key, 99)
        table = [
            ("baseline: bare pyvips, in-process", base["bare_ms"], base["bare_p99_ms"]),
            ("baseline: ops.run pipeline, in-process", base["pipeline_ms"], base["pipeline_p99_ms"]),
            ("sandbox alone: fork child + pipeline", results["sandbox_p50_ms"], results["sandbox_p99_ms"]),
            (
                "  of which child fork->exit",
                results["sandbox_child_p50_ms"],
                common.percentile(sb["child_ms"], 99),
            ),
            ("platform: client POST -> seen completed", results["client_p50_ms"], results["client_p99_ms"]),
            ("  POST /v1/hypermedia/process", results["post_p50_ms"], results["post_p99_ms"]),
            (
                "  job created_at -> completed_at",
                results["created_completed_p50_ms"],
                results["created_completed_p99_ms"],
            ),
            ("    queue: created -> claimed", results["queue_p50_ms"], results["queue_p99_ms"]),
            ("    attempt: claimed -> completed", results["attempt_p50_ms"], results["attempt_p99_ms"]),
            ("      sandbox child fork->exit", results["child_p50_ms"], results["child_p99_ms"]),
        ]
        say(common.table(table, ("ms per job", "p50", "p99")))
        results["steps"] = steps
        say("  single steps, p50 from this process: " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()))
        results["ratio"] = results["created_completed_p50_ms"] / base["bare_ms"]
        results["overhead_ms"] = results["created_completed_p50_ms"] - base["bare_ms"]
        results["client_overhead_ms"] = results["client_p50_ms"] - base["bare_ms"]
        say(
            f"  => p50 created->completed {results['created_completed_p50_ms']:.1f} ms vs {base['bare_ms']:.2f} ms "
            f"in-process: {results['ratio']:.0f}x, +{results['overhead_ms']:.1f} ms per job "
            f"(client-observed +{results['client_overhead_ms']:.1f} ms); retries {results['retries']}; "
            f"other processes used {noise.cores:.2f} cores meanwhile"
        )
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="jobs measured (default 100)")
    parser.add_argument("--poll-ms", type=float, default=5.0, help="GET /v1/jobs/{id} interval (default 5)")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platform's service logs here")
    parser.add_argument(
        "--internal-auth", choices=("mtls", "none"), default="mtls", help="HM_INTERNAL_AUTH (default mtls)"
    )
    args = parser.parse_args(argv)
    run(args.count, args.poll_ms, args.logs, internal_auth=args.internal_auth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
