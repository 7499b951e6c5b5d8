"""What one job writes to Postgres and JetStream: rows per table, transactions and WAL bytes, and
stream messages, per completed thumbnail (issue 24 item 2; the capacity model's inputs).

    .venv/bin/python bench/rows_per_job.py [--jobs 200] [--idle 30] [--json FILE]

1. Starts a private platform (``bench/common.py``: embedded Postgres and NATS, ``hypermedia up``
   with every service), makes a 64×64 PNG and uploads it, and runs 3 warm-up thumbnails.
2. **Idle window**: ``--idle`` seconds with no job, to measure what the platform writes by itself
   (heartbeats, worker metrics, pollers, the reaper's sweeps) per second.
3. **Job window**: ``--jobs`` thumbnails of the PNG (32 px WebP), 4 submitters, until all ended.
4. Each window is read from Postgres' cumulative statistics (``pg_stat_user_tables``:
   ``n_tup_ins``, ``n_tup_upd``, ``n_tup_del``; ``pg_stat_database.xact_commit``, every
   transaction, reads included), the next transaction id (``pg_current_snapshot()``: the
   transactions that wrote, each assigned an id, subtransactions included), ``pg_current_wal_lsn()``
   and JetStream's stream states (last sequence), after waiting
   :data:`STATS_FLUSH_SECONDS` for every backend's statistics to be flushed (PostgreSQL 15 flushes a
   backend's counters at most once a second and at the latest 10 s after it went idle:
   ``PGSTAT_IDLE_INTERVAL`` in ``pgstat.c``).
5. Prints, per table with any write, inserts, updates and deletes per job, after subtracting the
   idle rate times the job window's length; then the totals, Postgres transactions and WAL bytes
   per job, and JetStream messages per job. ``--json`` writes the same figures for
   ``bench/capacity_model.py``.

The upload and the account are made before either window, so the figures are those of
``POST /v1/hypermedia/process`` through completion and settlement. The statistics count every
backend of the database, the benchmark's own polling included: one ``SELECT`` every 20 ms, which
writes no row but commits a transaction (subtracted: its commits are counted and reported apart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, vipswork  # noqa: E402

SIZE = 32
STATS_FLUSH_SECONDS = 11.0
"""Wait before reading the statistics: PostgreSQL 15 flushes a busy backend's counters at most
once a second and an idle one's within 10 s (``PGSTAT_MIN_INTERVAL``, ``PGSTAT_IDLE_INTERVAL``)."""
NOISE_ROWS = 0.1
"""A table whose net rows per job are under this (either sign) is left out: the platform's own
writes (heartbeats, worker metrics, unit leases) that the idle rate's subtraction does not cancel
exactly."""
POLL_SECONDS = 0.02
"""The benchmark's own wait: one count query per poll (:func:`bench.common.wait_all_terminal`)."""


def pg_snapshot(dsn: str) -> dict[str, Any]:
    """Cumulative Postgres counters: per table ``(inserts, updates, deletes)``, the database's
    commits and the WAL position in bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {
            name: (ins, upd, dele)
            for name, ins, upd, dele in conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
            ).fetchall()
        }
        commits, wal, next_xid = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn,"
            " pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()  # type: ignore[misc]
    return {"tables": tables, "commits": int(commits), "wal": int(wal), "xids": int(next_xid)}


async def _stream_sequences(nats_url: str) -> dict[str, int]:
    import nats

    client = await nats.connect(nats_url)
    try:
        js = client.jetstream()
        return {info.config.name: info.state.last_seq for info in await js.streams_info()}
    finally:
        await client.close()


def stream_snapshot(nats_url: str) -> dict[str, int]:
    """The last sequence of every JetStream stream: messages stored so far."""
    return asyncio.run(_stream_sequences(nats_url))


def window(bp: common.BenchPlatform, nats_url: str, run: Any) -> tuple[dict[str, Any], float]:
    """Runs ``run()`` between two snapshots (statistics flushed first) and returns the deltas
    and the seconds ``run`` took."""
    time.sleep(STATS_FLUSH_SECONDS)
    pg_before, js_before = pg_snapshot(bp.dsn), stream_snapshot(nats_url)
    started = time.monotonic()
    run()
    seconds = time.monotonic() - started
    time.sleep(STATS_FLUSH_SECONDS)
    pg_after, js_after = pg_snapshot(bp.dsn), stream_snapshot(nats_url)
    tables = {
        name: tuple(a - b for a, b in zip(after, pg_before["tables"].get(name, (0, 0, 0)), strict=True))
        for name, after in pg_after["tables"].items()
    }
    delta = {
        "tables": tables,
        "commits": pg_after["commits"] - pg_before["commits"],
        "xids": pg_after["xids"] - pg_before["xids"],
        "wal": pg_after["wal"] - pg_before["wal"],
        "streams": {name: seq - js_before.get(name, 0) for name, seq in js_after.items()},
    }
    # The wait after the run is inside the window for the counters (the one before it precedes
    # the first snapshot): the idle rate is scaled over it too.
    return delta, seconds + STATS_FLUSH_SECONDS


def per_job(
    jobs_delta: dict[str, Any],
    jobs_seconds: float,
    idle: dict[str, Any],
    idle_seconds: float,
    jobs: int,
    polls: int,
) -> dict[str, Any]:
    """The job window's deltas less the idle rate over its length, divided by ``jobs``; the
    benchmark's ``polls`` (each a commit) taken out of the commits."""
    scale = jobs_seconds / idle_seconds

    def net(value: float, background: float) -> float:
        return (value - background * scale) / jobs

    tables = {}
    for name, counts in jobs_delta["tables"].items():
        background = idle["tables"].get(name, (0, 0, 0))
        row = tuple(round(net(c, b), 2) for c, b in zip(counts, background, strict=True))
        if abs(sum(row)) >= NOISE_ROWS:
            tables[name] = row
    return {
        "tables": dict(sorted(tables.items(), key=lambda item: -sum(item[1]))),
        "commits": round(net(jobs_delta["commits"] - polls, idle["commits"]), 2),
        "write_commits": round(net(jobs_delta["xids"], idle["xids"]), 2),
        "wal_bytes": round(net(jobs_delta["wal"], idle["wal"])),
        "stream_messages": {
            name: round(net(n, idle["streams"].get(name, 0)), 2)
            for name, n in jobs_delta["streams"].items()
            if n
        },
        "idle_per_second": {
            "rows": round(sum(sum(c) for c in idle["tables"].values()) / idle_seconds, 2),
            "commits": round(idle["commits"] / idle_seconds, 2),
            "write_commits": round(idle["xids"] / idle_seconds, 2),
            "wal_bytes": round(idle["wal"] / idle_seconds),
        },
    }


def run(jobs: int, idle_seconds: float, json_path: Path | None) -> dict[str, Any]:
    root = common.temp_root("hm-bench-rows-")
    print(f"rows per job: {jobs} thumbnails (64 px PNG → {SIZE} px WebP), {common.machine()}", flush=True)
    try:
        with vipswork.vips_pool(1, 1) as pool:
            png = root / "tiny.png"
            pool.submit(vipswork.make_tiny_png, str(png)).result()
        with common.running_platform(root / "platform") as bp, bp.client() as client:
            nats_url = bp.platform.env["HM_NATS_URL"]
            object_id = common.upload(client, png)["object_id"]
            warm = [common.submit_thumbnail(client, object_id, SIZE) for _ in range(3)]
            common.wait_all_terminal(bp.dsn, warm, timeout=120)

            idle, idle_window = window(bp, nats_url, lambda: time.sleep(idle_seconds))
            polls = 0

            def batch() -> None:
                nonlocal polls
                with ThreadPoolExecutor(4) as threads:
                    ids = list(
                        threads.map(lambda _: common.submit_thumbnail(client, object_id, SIZE), range(jobs))
                    )
                polls = common.wait_all_terminal(bp.dsn, ids, timeout=60 + 2 * jobs, poll=POLL_SECONDS)

            busy, busy_window = window(bp, nats_url, batch)
            figures = per_job(busy, busy_window, idle, idle_window, jobs, polls)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    rows = [(name, *counts, round(sum(counts), 2)) for name, counts in figures["tables"].items()]
    total = tuple(round(sum(r[i] for r in rows), 2) for i in range(1, 5))
    print(
        common.table(
            [*rows, ("all tables", *total)],
            ["table", "inserts/job", "updates/job", "deletes/job", "rows/job"],
        )
    )
    print(
        f"  Postgres: {figures['write_commits']} writing transactions (transaction ids assigned) and"
        f" {figures['commits']} transactions in all per job, {figures['wal_bytes']} WAL bytes per job"
    )
    print(f"  JetStream messages stored per job: {figures['stream_messages']}")
    idle_rate = figures["idle_per_second"]
    print(
        f"  by itself, idle: {idle_rate['rows']} rows/s, {idle_rate['write_commits']} writing and"
        f" {idle_rate['commits']} transactions in all/s,"
        f" {idle_rate['wal_bytes']} WAL bytes/s (subtracted above)"
    )
    figures["rows_per_job"] = total[3]
    figures["source"] = (
        f"bench/rows_per_job.py {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {jobs} thumbnails,"
        f" {common.machine()}, idle writes subtracted"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200, help="thumbnails in the job window (default 200)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle window (default 30)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    run(args.jobs, args.idle, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
