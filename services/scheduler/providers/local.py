"""The ``local`` provider: burst workers as processes on this machine (what ``hypermedia up
--scheduler`` runs, and what the tests run the whole loop with).

A burst worker of a one-queue pool is ``python -m services.{role}`` (the role of the queue), of a
pool of several queues ``python -m services.multiworker`` with ``HM_WORKER_QUEUES`` giving each
queue the pool's ``slots_per_worker``. It gets the scheduler's environment (database, NATS, peers)
with its own ``HM_BURST_WORKER_ID``, work directory, log file, status port (any free one) and range
of 64 sandbox uids, and, with mutual TLS, the certificate of its role from ``HM_SCHEDULER_LOCAL_TLS_DIR``
(``hypermedia up`` issues one per identity there). Each launch is recorded in
``{dir}/burst/{id}.json`` (pid, the process's start time in clock ticks, its uid slot): a new leader
on this machine finds the processes an old one launched, and a reused pid is not mistaken for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.scheduler.pools import Pool
from services.scheduler.providers import Instance

log = logging.getLogger(__name__)

UID_RANGE = 64
"""Sandbox uids per burst worker (``HM_WORKER_SLOTS`` is at most 64), as ``hypermedia up`` gives
each worker replica (``platform.UID_RANGE_PER_REPLICA``)."""
KILL_AFTER_SECONDS = 45.0
"""SIGTERM to SIGKILL: the worker's drain (35 s) and 10 s more."""
OWN_VARIABLES = ("HM_SCHEDULER_", "HM_TLS_", "HM_UNIT_NAME", "HM_WORKER_QUEUES", "HM_BURST_WORKER_ID")
"""Variables of the scheduler's environment a burst worker does not inherit (prefixes)."""
REPO = Path(__file__).resolve().parents[3]


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/{pid}/stat`` (start time in clock ticks), None when there is no such
    process or it is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def _spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )


class LocalProvider:
    """Burst workers as local processes.

    Args:
        directory: where the launch records and each worker's work directory go.
        log_dir: each worker's log, ``burst-{id}.log``.
        uid_base: the first sandbox uid of the burst workers (slot ``i`` gets ``base + 64·i``).
        max_workers: how many uid slots there are.
        tls_dir: the directory of ``hypermedia up``'s certificates, or None without mutual TLS.
        env: the environment the workers inherit (default ``os.environ``).
        stop_on_close: terminate every worker when the scheduler stops (``hypermedia up``: the
            platform stops with it); off, workers outlive a scheduler restart.
    """

    name = "local"

    def __init__(
        self,
        directory: Path,
        log_dir: Path,
        uid_base: int,
        max_workers: int,
        tls_dir: Path | None = None,
        env: dict[str, str] | None = None,
        stop_on_close: bool = False,
    ) -> None:
        self._dir = directory / "burst"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._work = directory / "work"
        self._log_dir = log_dir
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._uid_base = uid_base
        self._max = max_workers
        self._tls_dir = tls_dir
        self._env = {
            k: v for k, v in (os.environ if env is None else env).items() if not k.startswith(OWN_VARIABLES)
        }
        self._stop_on_close = stop_on_close
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def _records(self) -> list[dict[str, object]]:
        out = []
        for path in sorted(self._dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        return out

    def _alive(self, record: dict[str, object]) -> bool:
        pid = int(str(record["pid"]))
        if (child := self._children.get(pid)) is not None and child.poll() is not None:
            return False  # reaped now: it was our child
        ticks = record.get("ticks")
        return ticks is not None and start_ticks(pid) == ticks  # None: it was gone at launch

    def _command(self, pool: Pool) -> tuple[list[str], dict[str, str], str]:
        from hypermedia.worker.unit.settings import ROLE_OF_ROUTE  # the roles' table, not a worker import

        if len(pool.queues) == 1:
            role = ROLE_OF_ROUTE[pool.queues[0]].name
            env = {"HM_WORKER_QUEUE": pool.queues[0], "HM_WORKER_SLOTS": str(pool.slots_per_worker)}
            return [sys.executable, "-m", f"services.{role}"], env, role
        env = {"HM_WORKER_QUEUES": ",".join(f"{q}={pool.slots_per_worker}" for q in pool.queues)}
        return [sys.executable, "-m", "services.multiworker"], env, ROLE_OF_ROUTE[pool.queues[0]].name

    async def launch(self, pool: Pool, burst_worker_id: str) -> str:
        """Starts the worker process (see the module docstring); returns its pid. Raises
        RuntimeError when every uid slot is taken (more live workers than ``max_workers``)."""
        taken = {int(str(r["slot"])) for r in self._records() if self._alive(r)}
        slot = next((i for i in range(self._max) if i not in taken), None)
        if slot is None:
            raise RuntimeError(f"no free uid slot: {self._max} local burst workers are live")
        command, own, role = self._command(pool)
        work_dir = self._work / burst_worker_id
        env = (
            self._env
            | own
            | {
                "HM_BURST_WORKER_ID": burst_worker_id,
                "HM_WORK_DIR": str(work_dir),
                "HM_WORKER_STATUS_BIND": "127.0.0.1:0",
                "HM_METRICS_BIND": "",  # the scheduler's own port is in its environment
                "HM_SANDBOX_UID_BASE": str(self._uid_base + UID_RANGE * slot),
                "HM_DEPLOYMENT": self._env.get("HM_DEPLOYMENT", "local"),
            }
        )
        if self._tls_dir is not None:
            env |= {
                "HM_TLS_CA": str(self._tls_dir / "ca.pem"),
                "HM_TLS_CERT": str(self._tls_dir / f"{role}.pem"),
                "HM_TLS_KEY": str(self._tls_dir / f"{role}-key.pem"),
            }
        log_path = self._log_dir / f"burst-{burst_worker_id}.log"
        child = await asyncio.to_thread(_spawn, command, env, log_path)
        self._children[child.pid] = child
        record = {
            "burst_worker_id": burst_worker_id,
            "pool": pool.name,
            "pid": child.pid,
            "ticks": start_ticks(child.pid),
            "slot": slot,
            "work_dir": str(work_dir),
            "log": str(log_path),
            "launched": time.time(),
        }
        (self._dir / f"{burst_worker_id}.json").write_text(json.dumps(record))
        log.info("launched burst worker %s of pool %s: pid %d", burst_worker_id, pool.name, child.pid)
        return str(child.pid)

    def _instance(self, record: dict[str, object]) -> Instance:
        alive = self._alive(record)
        return Instance(
            str(record["burst_worker_id"]),
            str(record["pid"]),
            "running" if alive else "stopped",
            "" if alive else "the process exited",
        )

    async def list(self, pool: Pool) -> list[Instance]:
        return [self._instance(r) for r in self._records() if r.get("pool") == pool.name]

    async def describe(self, provider_ref: str) -> Instance | None:
        record = next((r for r in self._records() if str(r["pid"]) == provider_ref), None)
        return None if record is None else self._instance(record)

    async def terminate(self, provider_ref: str) -> None:
        """SIGTERM to the worker's process group (it drains), SIGKILL after
        :data:`KILL_AFTER_SECONDS`; then its record and work directory are removed."""
        record = next((r for r in self._records() if str(r["pid"]) == provider_ref), None)
        if record is None:
            return
        pid = int(provider_ref)
        if self._alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            if not await asyncio.to_thread(self._wait_gone, record, KILL_AFTER_SECONDS):
                log.warning(
                    "burst worker pid %d outlived SIGTERM by %.0fs: killing it", pid, KILL_AFTER_SECONDS
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if (child := self._children.pop(pid, None)) is not None:
            await asyncio.to_thread(child.wait)
        shutil.rmtree(str(record["work_dir"]), ignore_errors=True)
        (self._dir / f"{record['burst_worker_id']}.json").unlink(missing_ok=True)

    def _wait_gone(self, record: dict[str, object], timeout: float) -> bool:
        """Whether the process of ``record`` ended within ``timeout`` seconds (polled; blocking)."""
        deadline = time.monotonic() + timeout
        while self._alive(record):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    async def close(self) -> None:
        if self._stop_on_close:
            await asyncio.gather(
                *(self.terminate(str(r["pid"])) for r in self._records()), return_exceptions=True
            )
