"""Shared harness of the benchmarks: a private platform (embedded Postgres + NATS + ``hypermedia up``
as a subprocess, exactly as the end-to-end tests start it), an account, a REST client, reads of the
job timestamps from Postgres, percentiles and table printing.

Everything started here is stopped again: the platform with SIGINT (it stops its services in
reverse order), then NATS and Postgres, then the temporary directory is removed.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hypermedia.devtools.embedded import EmbeddedNats, EmbeddedPostgres  # noqa: E402
from tests.e2e.conftest import RunningPlatform, start_platform  # noqa: E402

TERMINAL = ("completed", "failed", "cancelled")

PLATFORM_ENV = {
    # start_platform's test settings use 1 s / 5 s; the benchmark runs the production defaults.
    "HM_REAPER_INTERVAL_SECONDS": "5",
    "HM_HEARTBEAT_SECONDS": "30",
}


def temp_root(prefix: str) -> Path:
    """A temporary directory searchable by others (the sandbox uids must reach the work dir)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o755)
    return path


@dataclass
class BenchPlatform:
    """A running platform with one funded account."""

    root: Path
    dsn: str
    platform: RunningPlatform
    account: dict[str, Any]
    nats_pid: int = 0

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.platform.rest_url,
            headers={"Authorization": f"Bearer {self.account['api_key']}"},
            timeout=timeout,
        )

    def logs_dir(self) -> Path:
        return self.platform.state_dir / "logs"


@contextlib.contextmanager
def running_platform(
    root: Path,
    *,
    credits: float = 1_000_000,
    keep_logs: Path | None = None,
    env: dict[str, str] | None = None,
    services: str | None = None,
) -> Iterator[BenchPlatform]:
    """Embedded Postgres and NATS under ``root``, ``hypermedia up`` on them (``env`` added to its
    environment; ``services`` a comma-separated subset, default all), an account with ``credits``. On exit everything is stopped (platform by SIGINT,
    then NATS, then Postgres); the service logs are copied to ``keep_logs`` first when given."""
    with contextlib.ExitStack() as stack:
        pg = EmbeddedPostgres(root / "pg").start()
        stack.callback(pg.stop)
        dsn = pg.create_database("hm_bench")
        nats = EmbeddedNats(root / "nats").start()
        stack.callback(nats.stop)
        platform = start_platform(root, dsn, nats.url, services, **{**PLATFORM_ENV, **(env or {})})

        def stop_platform() -> None:
            code = platform.stop()
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for log in (platform.state_dir / "logs").glob("*.log"):
                    shutil.copy(log, keep_logs / log.name)
                shutil.copy(platform.state_dir / "up.log", keep_logs / "up.log")
            if code != 0:
                print(f"warning: hypermedia up exited with {code}", file=sys.stderr)

        stack.callback(stop_platform)
        account = platform.admin("create-account", "--credits", str(credits), "--interactive")
        # The benchmarks measure the platform, not an account's job quota (hypermedia/jobs/quotas.py).
        platform.admin(
            "set-quota",
            account["account_id"],
            "--max-queued-jobs",
            "1000000",
            "--rate",
            "100000",
            "--burst",
            "1000000",
        )
        yield BenchPlatform(root, dsn, platform, account, nats.process.pid if nats.process else 0)


def upload(client: httpx.Client, path: Path) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (path.name, path.read_bytes())})
    response.raise_for_status()
    return dict(response.json())


def submit_thumbnail(client: httpx.Client, object_id: str, size: int) -> str:
    response = client.post(
        "/v1/hypermedia/process",
        json={"object_id": object_id, "operations": [{"name": "thumbnail", "params": {"size": size}}]},
    )
    if response.status_code != 202:
        raise RuntimeError(f"process answered {response.status_code}: {response.text}")
    return str(response.json()["job_ids"][0])


def job_timings(dsn: str, job_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Per job, from Postgres (one clock: the database server's): status, and as epoch seconds
    ``created`` (the gateway's insert transaction), ``attempt_started`` (the worker's claim),
    ``attempt_finished`` and ``completed`` (the worker's completion transaction), plus the sandbox
    child's ``child_ms`` (fork → exit, measured by the zygote)."""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        rows = conn.execute(
            """
            SELECT j.job_id::text AS job_id, j.status, j.attempt_count,
                   extract(epoch FROM j.created_at)::float8 AS created,
                   extract(epoch FROM j.completed_at)::float8 AS completed,
                   extract(epoch FROM a.started_at)::float8 AS attempt_started,
                   extract(epoch FROM a.finished_at)::float8 AS attempt_finished,
                   a.duration_ms AS child_ms
            FROM processing_jobs j
            LEFT JOIN job_attempts a ON a.job_id = j.job_id AND a.attempt_number = j.attempt_count
            WHERE j.job_id = ANY(%s::uuid[])
            """,
            (list(job_ids),),
        ).fetchall()
    by_id = {r["job_id"]: r for r in rows}
    return [by_id[j] for j in job_ids]


def wait_all_terminal(dsn: str, job_ids: Sequence[str], timeout: float, poll: float = 0.02) -> int:
    """Block until every job has ended (one cheap count query per ``poll``, not REST polling,
    so the measurement does not load the gateway); returns how many queries it made."""
    deadline = time.monotonic() + timeout
    queries = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM processing_jobs WHERE job_id = ANY(%s::uuid[]) AND status = ANY(%s)",
                (list(job_ids), list(TERMINAL)),
            ).fetchone()
            queries += 1
            if row is not None and row[0] == len(job_ids):
                return queries
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(job_ids) - (row[0] if row else 0)} jobs still running")
            time.sleep(poll)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def iso_epoch(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain fixed-width text table."""
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def machine() -> str:
    import psutil

    return f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 1024**3:.0f} GiB"


class Background:
    """CPU time used by processes that are *not* this benchmark or its descendants (other users of
    a shared machine) between :meth:`start` and :meth:`stop`: how noisy the measurement was.
    Processes that both start and end inside the window are missed, so this is a lower bound."""

    def __init__(self) -> None:
        self._before: dict[int, float] = {}
        self._started = 0.0
        self.core_seconds = 0.0
        self.seconds = 0.0

    @staticmethod
    def _sample() -> dict[int, float]:
        import psutil

        me = psutil.Process()
        ours = {me.pid} | {p.pid for p in me.children(recursive=True)}
        sample = {}
        for proc in psutil.process_iter(["pid", "cpu_times"]):
            times = proc.info["cpu_times"]
            if proc.info["pid"] not in ours and times is not None:
                sample[proc.info["pid"]] = times.user + times.system
        return sample

    def start(self) -> Background:
        self._before = self._sample()
        self._started = time.monotonic()
        return self

    def stop(self) -> Background:
        after = self._sample()
        self.seconds = time.monotonic() - self._started
        self.core_seconds = sum(t - self._before.get(pid, 0.0) for pid, t in after.items())
        return self

    @property
    def cores(self) -> float:
        """Average number of cores the other processes kept busy."""
        return self.core_seconds / self.seconds if self.seconds else 0.0


UNIT_MODULE = "hypermedia.worker.unit"
"""A worker unit's control process (``-m hypermedia.worker.unit``): it runs the engine's service
(``-m services.imageworker``, the execution process) as its child."""


def _service_name(proc: Any) -> str:
    cmd = proc.cmdline()
    return cmd[cmd.index("-m") + 1].removeprefix("services.") if "-m" in cmd else proc.name()


def cpu_snapshot(bp: BenchPlatform) -> dict[str, float]:
    """CPU seconds (user + system) so far, per part of the running platform: each service process,
    the worker's sandbox ``zygote`` and its reaped job ``children`` (the zygote's children times),
    ``postgres`` (postmaster and its backends) and ``nats``. Differences of two snapshots say where
    the CPU went in between."""
    import psutil

    groups: dict[str, float] = {}

    def add(name: str, seconds: float) -> None:
        groups[name] = groups.get(name, 0.0) + seconds

    with contextlib.suppress(psutil.Error):
        for service in psutil.Process(bp.platform.process.pid).children():
            with contextlib.suppress(psutil.Error):
                name = _service_name(service)
                if name == UNIT_MODULE:  # a worker unit: its execution process is the service
                    name = "worker unit control"
                t = service.cpu_times()
                add(name, t.user + t.system)
                for sub in service.children(recursive=True):
                    st = sub.cpu_times()
                    if "_zygote_main" in " ".join(sub.cmdline()):
                        add("sandbox zygote", st.user + st.system)
                        add("sandbox job children", st.children_user + st.children_system)
                    else:
                        own = _service_name(sub)
                        add(
                            own if own != sub.name() else name,
                            st.user + st.system + st.children_user + st.children_system,
                        )
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        pm = psutil.Process(int((bp.root / "pg" / "postmaster.pid").read_text().split()[0]))
        for proc in [pm, *pm.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                add("postgres", t.user + t.system)
    with contextlib.suppress(psutil.Error):
        if bp.nats_pid:
            t = psutil.Process(bp.nats_pid).cpu_times()
            add("nats", t.user + t.system)
    return groups


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        k: after[k] - before.get(k, 0.0)
        for k in sorted(after, key=lambda k: -(after[k] - before.get(k, 0.0)))
    }
