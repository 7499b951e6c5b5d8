"""A long transcode fanned out to child jobs (issue 23 item 2, ADR 0081) on 1, 2 and 4 local
media units, against the same job made by one unit without fanning out, in the same run.

    .venv/bin/python bench/fan_out.py [--seconds 300] [--units 1,2,4] [--chunk-seconds 30]

1. **Input**: bench/media.py's ``make_video``: ``--seconds`` (default 300: the issue's 5 minutes)
   of 1080p25 H.264 (a keyframe every 10 s, grain, about 12 Mbit/s) with AAC sound; nothing is
   downloaded.
2. **Platform**: a private one (embedded Postgres and NATS; credits, storage, gateway, reaper),
   and for each row its own *media units*: one-slot mediaworker processes
   (``HM_MEDIA_ENCODER_THREADS`` 2, the default), started for the row and stopped after it. No
   unit has a CPU limit: the units of a row share this machine's cores, so on 2 cores 4 units
   get half a core each at best. That is the *CPU share* of each row, printed beside it.
3. **Rows**: the job on one unit with fan-out off (``HM_MEDIA_FAN_OUT_SECONDS`` 0: one pass in
   chunks, ADR 0080) — the baseline; then fanned out (chunks of ``--chunk-seconds``: one child
   job per chunk but the last) on each count of ``--units``. One ``transcode_video`` into
   ``[1080, 720, 480]`` per row.
4. **Measured**: wall seconds from the job's ``created_at`` to its ``completed_at`` (Postgres),
   the machine's busy CPU seconds meanwhile (``/proc/stat``; the machine is otherwise idle), the
   children and the workers that ran them, and every rendition's frame count, which must be the
   baseline's. Printed: each row's ratio of the baseline's wall time to its own (the speed-up)
   and of its CPU seconds to the baseline's (the overhead).

The issue sets no figure for the speed-up: nothing here is MET or MISSED; the ratios say what
fanning out gives on a machine of this many cores. The 200-page scan the issue also names is
``bench/fan_out_ocr.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchPlatform, running_platform, table, temp_root, upload, wait_all_terminal
from bench.media import make_video
from hypermedia.devtools.embedded import free_port
from tests.e2e.conftest import REPO

HEIGHTS = [1080, 720, 480]


def busy_seconds() -> float:
    """The machine's busy CPU seconds so far (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def start_units(
    bench: BenchPlatform, count: int, env: dict[str, str], service: str = "mediaworker"
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` one-slot workers of ``service`` with ``env``, registered before this yields;
    stopped after."""
    platform = bench.platform
    workers = []
    try:
        for n in range(count):
            worker_env = platform.service_env(service) | {
                "HM_WORKER_SLOTS": "1",
                "HM_WORK_DIR": str(platform.state_dir / f"work-unit-{time.monotonic_ns()}-{n}"),
                "HM_WORKER_STATUS_BIND": f"127.0.0.1:{free_port()}",
                **env,
            }
            with (bench.logs_dir() / f"{service}-unit-{n}.log").open("ab") as log:
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", f"services.{service}"],
                        env=worker_env,
                        cwd=REPO,
                        stdout=log,
                        stderr=log,
                    )
                )
        with psycopg.connect(bench.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while True:
                pids = [w.pid for w in workers]
                row = conn.execute(
                    "SELECT count(DISTINCT pid) FROM workers WHERE pid = ANY(%s) AND status = 'running'",
                    (pids,),
                ).fetchone()
                if row is not None and row[0] == count:
                    break
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    seen = conn.execute("SELECT pid, status FROM workers").fetchall()
                    raise RuntimeError(f"the units {pids} did not start (see {bench.logs_dir()}): {seen}")
                time.sleep(0.2)
        yield workers
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(120)


def run_job(
    bench: BenchPlatform,
    object_id: str,
    operation: dict[str, Any],
    units: int,
    env: dict[str, str],
    service: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One job of ``operation`` on ``object_id`` on ``units`` fresh
    one-slot ``service`` workers with ``env``: the completed job (REST) and its measures: wall
    seconds (``created_at`` to ``completed_at``), the machine's busy CPU seconds meanwhile, its
    children and the workers that ran them.

    Raises:
        RuntimeError: the job did not complete.
    """
    with start_units(bench, units, env, service), bench.client(timeout=120) as client:
        busy = busy_seconds()
        created = client.post(
            "/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]}
        )
        created.raise_for_status()
        job_id = created.json()["job_ids"][0]
        wait_all_terminal(bench.dsn, [job_id], timeout=7200, poll=0.5)
        cpu = busy_seconds() - busy
        job = client.get(f"/v1/jobs/{job_id}").json()
    if job["status"] != "completed":
        raise RuntimeError(
            f"the job ended {job['status']}: {job.get('error_code')} {job.get('error_message')}"
        )
    with psycopg.connect(bench.dsn, autocommit=True) as conn:
        wall = conn.execute(
            "SELECT extract(epoch FROM completed_at - created_at)::float8 FROM processing_jobs WHERE job_id = %s",
            (job_id,),
        ).fetchone()
        children = conn.execute(
            "SELECT count(DISTINCT c.job_id), count(DISTINCT a.worker_id) FROM processing_jobs c "
            "LEFT JOIN job_attempts a USING (job_id) WHERE c.parent_job_id = %s",
            (job_id,),
        ).fetchone()
    assert wall is not None and children is not None
    return job, {"wall": float(wall[0]), "cpu": cpu, "children": children[0], "workers": children[1]}


def _row(
    bench: BenchPlatform, object_id: str, units: int, fan_out: bool, chunk_seconds: float
) -> dict[str, Any]:
    """One transcode on ``units`` fresh media units (:func:`run_job`), and the frames of each
    rendition."""
    env = {
        "HM_MEDIA_FAN_OUT_SECONDS": "1" if fan_out else "0",  # fanned out by its chunk count
        "HM_MEDIA_FAN_OUT_CHUNK_SECONDS": str(chunk_seconds),
    }
    operation = {"name": "transcode_video", "params": {"heights": HEIGHTS}}
    job, measured = run_job(bench, object_id, operation, units, env, "mediaworker")
    return measured | {"frames": {o["output_type"]: o["metadata"]["frame_count"] for o in job["outputs"]}}


def speed_table(
    rows: list[tuple[str, int, dict[str, Any]]],
    cores: int,
    checked: str,
    same: Callable[[dict[str, Any], dict[str, Any]], bool],
) -> str:
    """The rows ``(name, units, measures)`` against the first (the baseline): each unit's CPU
    share, wall seconds, speed-up, CPU seconds and their ratio, children, units used, and
    whether the result ``checked`` is the baseline's (``same(row, base)``)."""
    base = rows[0][2]
    return table(
        [
            (
                name,
                f"{min(1.0, cores / units):.2g} core(s) each",
                f"{row['wall']:.1f}",
                f"{base['wall'] / row['wall']:.2f}×",
                f"{row['cpu']:.0f}",
                f"{row['cpu'] / base['cpu']:.2f}×",
                row["children"],
                row["workers"],
                "same" if same(row, base) else "DIFFERS",
            )
            for name, units, row in rows
        ],
        [
            "row",
            "CPU share",
            "wall s",
            "speed-up",
            "CPU s",
            "CPU / baseline",
            "children",
            "units used",
            checked,
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="length of the input video (s)")
    parser.add_argument("--units", default="1,2,4", help="media unit counts of the fanned-out rows")
    parser.add_argument("--chunk-seconds", type=float, default=30.0, help="HM_MEDIA_FAN_OUT_CHUNK_SECONDS")
    args = parser.parse_args()
    counts = [int(n) for n in args.units.split(",")]
    cores = os.cpu_count() or 1
    root = temp_root("hm-bench-fanout-")
    # Made once and kept: 5 minutes of 1080p take this machine about 6 minutes to make.
    source = Path(tempfile.gettempdir()) / f"hm-bench-fanout-{args.seconds:g}s.mp4"
    if not source.is_file():
        print(f"making {args.seconds:g} s of 1080p25 H.264 + AAC into {source} ...", flush=True)
        make_video(source.with_suffix(".part.mp4"), args.seconds)
        source.with_suffix(".part.mp4").rename(source)
    print(f"input: {source} ({source.stat().st_size / 1e6:.0f} MB); {cores} cores", flush=True)
    env = {"HM_MAX_UPLOAD_BYTES": str(4 << 30)}
    logs = Path(tempfile.gettempdir()) / "hm-bench-fanout-logs"
    with running_platform(root, env=env, services="credits,storage,gateway,reaper", keep_logs=logs) as bench:
        with bench.client(timeout=600) as client:
            object_id = upload(client, source)["object_id"]
        rows = [("one job, 1 unit", 1, _row(bench, object_id, 1, False, args.chunk_seconds))]
        print(f"baseline: {rows[0][2]['wall']:.1f} s", flush=True)
        for count in counts:
            rows.append(
                (
                    f"fanned out, {count} unit(s)",
                    count,
                    _row(bench, object_id, count, True, args.chunk_seconds),
                )
            )
            print(f"{rows[-1][0]}: {rows[-1][2]['wall']:.1f} s", flush=True)
    print()
    print(speed_table(rows, cores, "frames", lambda row, base: row["frames"] == base["frames"]))
    print(
        f"\nNo goal in the issue for the speed-up (not MET or MISSED). The units share {cores} cores:"
        " a row of more units than cores cannot go faster than the cores allow. The 200-page scan is"
        " bench/fan_out_ocr.py."
    )


if __name__ == "__main__":
    main()
