"""Per-job sandbox: one forked, rlimited, unprivileged process per job, started from a warm zygote.

Shape::

    worker (asyncio) ──stdin: pickled requests──▶ zygote ──fork()──▶ child (one per job)
           ◀──stdout: JSON lines (started/exited)──   ◀──pipe: JSON report──

* The **zygote** is a separate Python process started once by :meth:`Sandbox.start`. It imports
  the preload modules (``pyvips``, ``hypermedia.imaging.ops``) and never runs a libvips operation,
  so forking it is safe and cheap (a process that has *run* a libvips operation must not fork: the
  child deadlocks in libvips' thread pool). The asyncio worker never forks and never runs libvips.
  The zygote is single-threaded: a selector loop over its stdin, the children's report pipes and a
  SIGCHLD self-pipe. It reaps children with ``wait4`` (exit status and ``ru_maxrss`` even for a
  child killed by a signal), kills a job's process group only while the group leader is still
  unreaped (no pid-reuse race), and is a child subreaper, so orphaned grandchildren are reaped too.
  ``multiprocessing``'s forkserver was the alternative; it gives neither ``wait4`` rusage of the
  child nor race-free group kills, and its context is global per process.
* The **child** (see :func:`_child_main`) starts a new session (its own process group), optionally
  a new network namespace, sets ``RLIMIT_CPU`` (soft = timeout, hard = timeout + 1 s),
  ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` and ``RLIMIT_CORE`` = 0, drops to the sandbox
  uid/gid with no supplementary groups, sets ``no_new_privs`` and a parent-death signal, ``umask
  077``, ``chdir`` to the job dir, replaces the environment, keeps only stdin/stdout on
  ``/dev/null``, stderr and its report pipe, then calls the entry.
* **Threads and RLIMIT_NPROC**: the kernel counts every thread of every process of a uid against
  ``RLIMIT_NPROC``, across all slots that share the uid. Children run with ``VIPS_CONCURRENCY=1``
  (throughput comes from slots, one job per core; libheif/aom follow it too), which keeps an image
  job at 4 threads at its peak (measured by ``tests/unit/sandbox_entries.py:image_threads``).
  Under the default ``nproc=16``, one shared sandbox uid fits 4 image jobs at once; give the
  sandbox a pool of uids at least as large as the slots (``uid=range(...)``) for more, which
  also keeps one job's threads from starving another's. Without root there is no sandbox uid:
  jobs run as the worker's own uid, whose tasks (the worker's threads, the zygote, other jobs)
  all count, so the limit becomes "16 more than the uid has now" (:func:`_uid_tasks`) — a bound
  on a fork bomb, shared with concurrent jobs; the container's ``pids.max`` is the hard one.
* **Network**: with root, each child gets an empty network namespace (``unshare(CLONE_NEWNET)``);
  measured cost about 1.5 ms per job, so it is on by default (``isolate_network``).
* **Files**: the job dir is the only place the child can write. Its uid owns nothing else, and
  with root each child also gets a mount namespace (``unshare(CLONE_NEWNS)``) in which the
  world-writable directories (:data:`SHARED_WRITABLE_DIRS`: ``/tmp``, ``/var/tmp``, ``/dev/shm``,
  …) are empty read-only tmpfs mounts — the job dir, when it lies under one of them, is
  bind-mounted back in place, and so are the Python environment, the standard library and the
  checkout, read-only (:func:`_code_dirs`); a directory others may not search on the way to
  those (``/root`` holding a pyenv Python) is covered the same way (:func:`_covered_dirs`). Without root (or where the namespace is refused) those directories
  stay writable to the job; the report says so and the worker logs it once.
* The **result** travels as JSON only (a child handles hostile input; its report is parsed as
  data, never unpickled), at most :data:`MAX_REPORT_BYTES`. Outputs are rebuilt as
  :class:`OutputFile` and must be regular files (not symlinks) directly inside ``output/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import functools
import gc
import importlib
import json
import logging
import math
import os
import pickle
import pwd
import re
import resource
import selectors
import shutil
import signal
import stat
import struct
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from opentelemetry import trace

from hypermedia import landlock
from hypermedia.errors import DomainError

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

MAX_REPORT_BYTES: Final = 1 << 20
"""Largest JSON report a child may send; a longer one is cut off and the job fails ``INTERNAL``."""

DEFAULT_CHILD_ENV: Final[Mapping[str, str]] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "VIPS_CONCURRENCY": "1",
}
"""Environment of the zygote and the children; ``HOME`` and ``TMPDIR`` are set to the job dir."""

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_LEN = struct.Struct(">I")

ZYGOTE_START_SECONDS: Final = 60.0
"""How long a (re)start of the zygote may take to import its preload modules and say it is ready
(measured here: 0.3–1.5 s for the media and OCR preloads, several times that on a loaded
machine); past it the start fails and the job is ``SANDBOX_UNAVAILABLE``."""
ZYGOTE_RESTARTS_PER_RUN: Final = 2
"""How often :meth:`Sandbox.run` restarts a zygote found dead, or lost before the job's child was
forked, before it gives the job ``SANDBOX_UNAVAILABLE``: a job that arrives while the zygote
restarts waits for the restart instead of failing an attempt."""

# Linux constants (uapi/linux/prctl.h, uapi/linux/sched.h).
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
# uapi/linux/mount.h
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18

SHARED_WRITABLE_DIRS: Final = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")
"""Directories every user may write to (mode 1777 on Debian); hidden from jobs (see module doc)."""


@dataclass(frozen=True)
class OutputFile:
    """One file an entry wrote into its ``output/`` directory.

    Defined here because every worker's entry returns these; ``hypermedia.imaging.ops`` re-exports it.
    """

    output_type: str
    """What the file is: ``thumbnail``, ``resized``, ``compressed``, ``converted``, …"""
    filename: str
    """Plain file name inside the output directory (no directories)."""
    mime_type: str
    """Content type, e.g. ``image/webp``."""
    metadata: dict
    """JSON-safe facts about the file, e.g. ``{"width": 256, "height": 171, "format": "webp"}``."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds of one job's child process."""

    cpu_seconds: int
    """``RLIMIT_CPU`` soft limit (SIGXCPU → ``TIMEOUT``); the profile's timeout."""
    wall_seconds: float
    """Wall clock, enforced by the worker: the job's process group is killed (``TIMEOUT``). Usually
    timeout × 1.5."""
    memory_bytes: int
    """``RLIMIT_AS``: address space, in bytes (2 GiB for images)."""
    fsize_bytes: int
    """``RLIMIT_FSIZE``: largest file the child may write, in bytes."""
    nproc: int = 16
    """``RLIMIT_NPROC``: processes *and threads* of the sandbox uid, counted across all slots."""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed job."""

    outputs: list[OutputFile]
    """What the entry returned; empty on failure."""
    error_code: str | None
    """``None`` on success; else a bounded code: the entry's ``DomainError.error_code``,
    ``RESOURCE_LIMIT``, ``TIMEOUT``, ``SANDBOX_CRASHED``, ``SANDBOX_UNAVAILABLE``, ``CANCELLED``
    or ``INTERNAL``."""
    error_message: str | None
    """Public message; never a path or a traceback."""
    retryable: bool
    """Whether another attempt may succeed (``TIMEOUT``, a lost zygote and one that would not
    start are)."""
    duration_ms: int
    """Wall time of the child, fork to exit."""
    peak_memory_mb: int
    """Peak resident set of the child (``ru_maxrss``), MiB rounded up."""


@dataclass
class _Job:
    job_id: str
    output_dir: Path
    limits: SandboxLimits
    done: asyncio.Future[dict[str, Any]]
    pid: int | None = None
    cancelled: bool = False
    timed_out: bool = False


@dataclass
class _Exit:
    """What the zygote reports about a finished child (also the 'exited' JSON line)."""

    status: int | None
    maxrss_kib: int = 0
    cpu_seconds: float = 0.0
    duration_ms: int = 0
    report: str | None = None
    failure: str | None = None


class Sandbox:
    """Runs entries (``"module:function"``) in fresh, limited child processes of a warm zygote.

    Args:
        work_dir: parent of ``jobs/{job_id}/``. Every ancestor must be searchable by the sandbox
            uid; :meth:`start` checks.
        preload: modules the zygote imports once, so children start warm. They must not start
            threads or run libvips operations at import.
        uid: uid the children run as, or a pool of uids. Default: ``nobody`` when the worker runs
            as root (euid 0), else none (children keep the worker's uid). Any other uid needs root.
            With a pool, each prepared job leases the least-used uid until :meth:`cleanup`; a pool
            at least as large as the worker's slots gives every running job ``RLIMIT_NPROC`` to
            itself (the kernel counts threads per uid, across slots).
        isolate_network: give each child an empty network namespace (root only). Costs a few
            milliseconds per job; on failure the job runs anyway and a warning is logged once.
        env: environment of the children (replaces, never extends, the worker's).
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        preload: Sequence[str] = ("pyvips", "hypermedia.imaging.ops"),
        uid: int | Sequence[int] | None = None,
        isolate_network: bool = True,
        env: Mapping[str, str] = DEFAULT_CHILD_ENV,
    ) -> None:
        self.work_dir = Path(work_dir).absolute()
        self.preload = tuple(preload)
        is_root = os.geteuid() == 0
        if uid is None:
            uids: tuple[int, ...] = (pwd.getpwnam("nobody").pw_uid,) if is_root else ()
        else:
            uids = (uid,) if isinstance(uid, int) else tuple(uid)
        if not is_root and any(u != os.geteuid() for u in uids):
            raise ValueError(f"sandbox uids {uids} need the worker to run as root")
        self.uids = uids if is_root else ()
        self._sweep_uids = is_root and uid is not None
        """Kill what is left of a job's uid when it ends: only for a pool given to this sandbox,
        never for the shared ``nobody`` fallback (other software runs as nobody)."""
        self.isolate_network = isolate_network and is_root
        self.env = dict(env)
        self._leases: dict[str, int] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._jobs: dict[str, _Job] = {}
        self._warned_network = False
        self._warned_files = False
        self._restart = asyncio.Lock()

    @property
    def uid(self) -> int | None:
        """The first (or only) sandbox uid; ``None`` when children keep the worker's uid."""
        return self.uids[0] if self.uids else None

    def job_uid(self, job_id: str) -> tuple[int, int] | None:
        """``(uid, gid)`` the job runs as, leased by :meth:`prepare`; ``None`` without privilege drop."""
        if not self.uids:
            return None
        uid = self._leases.get(job_id)
        if uid is None:
            counts = {u: 0 for u in self.uids}
            for leased in self._leases.values():
                counts[leased] += 1
            uid = min(self.uids, key=lambda u: counts[u])
            self._leases[job_id] = uid
        return uid, _primary_gid(uid)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates ``work_dir/jobs`` and starts the zygote; returns once it has imported the
        preload modules.

        Raises:
            ValueError: the sandbox uid cannot reach ``work_dir``.
            RuntimeError: the zygote failed to start (e.g. a preload module does not import) or
                was not ready within :data:`ZYGOTE_START_SECONDS`.
        """
        jobs_root = self.work_dir / "jobs"
        jobs_root.mkdir(parents=True, exist_ok=True)
        os.chmod(jobs_root, 0o711)
        for uid in self.uids:
            _check_reachable(jobs_root, uid)
        zygote_env = dict(self.env)
        zygote_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from hypermedia.sandbox import _zygote_main; _zygote_main()",
            json.dumps(list(self.preload)),
            json.dumps(self._sweep_uids),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=zygote_env,
            start_new_session=True,
            limit=2 * MAX_REPORT_BYTES + 4096,
        )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), ZYGOTE_START_SECONDS)
        except TimeoutError:
            line = b""
        if json.loads(line or b"{}").get("event") != "ready":
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                self._proc.kill()
            await self.close()
            raise RuntimeError(
                f"sandbox zygote exited or was not ready within {ZYGOTE_START_SECONDS:g} s; see its stderr"
            )
        self._reader = asyncio.create_task(self._read_events(self._proc.stdout), name="sandbox-zygote")

    async def close(self) -> None:
        """Stops the zygote; it SIGKILLs every running child first. Pending :meth:`run` calls return
        ``SANDBOX_CRASHED`` (retryable)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            await self._reader
            self._reader = None

    # --- job directories ---------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        """``work_dir/jobs/{job_id}``. Raises ValueError for an id that is not a plain name."""
        if not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"invalid job id {job_id!r}")
        return self.work_dir / "jobs" / job_id

    def prepare(self, job_id: str) -> Path:
        """Creates a fresh ``jobs/{job_id}/`` with ``input/`` and ``output/``, mode 0700, owned by
        the sandbox uid; leftovers of an earlier attempt are removed first. Returns the job dir."""
        job_dir = self.job_dir(job_id)
        if job_dir.exists() or job_dir.is_symlink():
            shutil.rmtree(job_dir)
        owner = self.job_uid(job_id)
        for path in (job_dir, job_dir / "input", job_dir / "output"):
            path.mkdir(mode=0o700)
            if owner is not None:
                os.chown(path, *owner)
        return job_dir

    def cleanup(self, job_id: str) -> None:
        """Removes ``jobs/{job_id}/`` and everything in it (symlinks are removed, not followed) and
        returns the job's uid lease."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
        self._leases.pop(job_id, None)

    def remove_leftovers(self) -> list[str]:
        """Removes every job directory not of a job running here now: what a crashed worker left
        behind under ``jobs/``. Call at start, before the first job. Returns the names removed."""
        jobs = self.work_dir / "jobs"
        removed = []
        for entry in sorted(jobs.iterdir()) if jobs.is_dir() else ():
            if entry.name in self._jobs or entry.name in self._leases:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
        return removed

    # --- jobs --------------------------------------------------------------------------------

    async def run(
        self,
        job_id: str,
        entry: str,
        operation: str,
        params: dict,
        input_path: Path,
        limits: SandboxLimits,
        *,
        entry_kwargs: Mapping[str, Any] | None = None,
    ) -> SandboxResult:
        """Runs ``entry(operation, params, input_path, job_dir / "output", **entry_kwargs)`` in a
        fresh child of the zygote and waits for it, at most ``limits.wall_seconds``.

        ``entry`` is ``"module:function"``; it returns a list of :class:`OutputFile`. The job dir
        must come from :meth:`prepare`; an input inside it is handed to the sandbox uid.
        ``entry_kwargs`` are pickled to the zygote (trusted direction), e.g.
        ``{"limits": ImageLimits(...)}``. A zygote found dead, or lost before it forked the job's
        child, is restarted and the job waits for it (at most :data:`ZYGOTE_RESTARTS_PER_RUN`
        restarts of :data:`ZYGOTE_START_SECONDS` each, then ``SANDBOX_UNAVAILABLE``, retryable).
        Never raises for a failed job: the failure is in the result. Raises ValueError for a bad
        job id or one already running.
        """
        job_dir = self.job_dir(job_id)
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already running")
        with _tracer.start_as_current_span(
            "sandbox.run", attributes={"job.id": job_id, "entry": entry}
        ) as span:
            request = {
                "op": "run",
                "job_id": job_id,
                "entry": entry,
                "kwargs": dict(entry_kwargs or {}),
                "job_dir": str(job_dir),
                "limits": dataclasses.asdict(limits),
                "isolate_network": self.isolate_network,
                "env": {**self.env, "HOME": str(job_dir), "TMPDIR": str(job_dir)},
            }
            result = _unavailable("The job's sandbox kept failing to start; it will be retried.")
            for restarts in range(ZYGOTE_RESTARTS_PER_RUN + 1):
                try:
                    await self._ensure_zygote()
                except (RuntimeError, OSError) as exc:
                    log.error("sandbox zygote could not be started for job %s: %s", job_id, exc)
                    result = _unavailable("The job's sandbox could not be started; it will be retried.")
                    break
                job, event = await self._submit(request, (operation, params), Path(input_path), limits)
                if event.get("failure") != "zygote lost" or job.pid is not None or job.cancelled:
                    result = self._result(job, _exit_from_event(event))
                    break
                # The zygote died before it forked this job's child (no "started" event): the job
                # has not run. Wait for a new zygote instead of failing an attempt that never began.
                log.warning(
                    "sandbox zygote lost before job %s started (restart %d of %d)",
                    job_id,
                    restarts + 1,
                    ZYGOTE_RESTARTS_PER_RUN,
                )
            span.set_attribute("error_code", result.error_code or "")
            return result

    def _alive(self) -> bool:
        """Whether the zygote can take a job: running, its stdin open, its events still read. Its
        exit is seen on stdout (the reader ends) before asyncio reaps it (``returncode``)."""
        proc = self._proc
        return (
            proc is not None
            and proc.returncode is None
            and proc.stdin is not None
            and not proc.stdin.is_closing()
            and self._reader is not None
            and not self._reader.done()
        )

    async def _ensure_zygote(self) -> None:
        """Restarts the zygote when it is not :meth:`_alive`; one restart even when several jobs
        find it gone (they wait on the lock). Raises RuntimeError/OSError from :meth:`start`."""
        async with self._restart:
            if not self._alive():
                if self._proc is not None:
                    log.warning("sandbox zygote is gone; restarting it")
                await self.close()
                await self.start()

    async def _submit(
        self, request: dict[str, Any], call: tuple[str, dict], input_path: Path, limits: SandboxLimits
    ) -> tuple[_Job, dict[str, Any]]:
        """Sends ``request`` (:meth:`run`'s, without the arguments: ``call`` is the operation and
        its params) to the zygote and waits for the child's exit event, at most
        ``limits.wall_seconds`` (then kills it). Returns the job and its event; a zygote lost on
        the way is ``{"status": None, "failure": "zygote lost"}``."""
        job_id = request["job_id"]
        job_dir = Path(request["job_dir"])
        owner = self.job_uid(job_id)
        input_path = self._hand_over_input(job_dir, input_path, owner)
        job = _Job(job_id, job_dir / "output", limits, asyncio.get_running_loop().create_future())
        # Registered before the next await: a reader that ends from here on resolves it.
        self._jobs[job_id] = job
        request = {
            **request,
            "args": (*call, input_path, job.output_dir),
            "uid": owner[0] if owner else None,
            "gid": owner[1] if owner else None,
        }
        try:
            self._send(request)
            try:
                event = await asyncio.wait_for(asyncio.shield(job.done), limits.wall_seconds)
            except TimeoutError:
                job.timed_out = True
                self._send({"op": "kill", "job_id": job_id})
                event = await asyncio.wait_for(job.done, 10)
        except (TimeoutError, OSError, ConnectionError) as exc:
            log.error("sandbox zygote lost during job %s: %r", job_id, exc)
            event = {"status": None, "failure": "zygote lost"}
        finally:
            self._jobs.pop(job_id, None)
        return job, event

    @staticmethod
    def _hand_over_input(job_dir: Path, input_path: Path, owner: tuple[int, int] | None) -> Path:
        """Absolute input path; an input inside the job dir is chowned to the job's uid."""
        input_path = input_path.absolute()
        if owner is not None and input_path.is_relative_to(job_dir):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(input_path, *owner)
        return input_path

    def cancel(self, job_id: str) -> bool:
        """SIGKILLs the job's process group; its :meth:`run` returns ``CANCELLED``. False when the
        job is not running here."""
        job = self._jobs.get(job_id)
        if job is None or job.done.done():
            return False
        job.cancelled = True
        with contextlib.suppress(OSError, RuntimeError):
            self._send({"op": "kill", "job_id": job_id})
        return True

    # --- internals ---------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self._proc is None or self._proc.stdin is None or self._proc.stdin.is_closing():
            raise ConnectionError("sandbox zygote is not running")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.write(_LEN.pack(len(payload)) + payload)

    async def _read_events(self, stdout: asyncio.StreamReader) -> None:
        try:
            while line := await stdout.readline():
                event = json.loads(line)
                job = self._jobs.get(event.get("job_id", ""))
                if job is None:
                    continue
                if event["event"] == "started":
                    job.pid = event["pid"]
                elif not job.done.done():
                    job.done.set_result(event)
        finally:
            for job in self._jobs.values():
                if not job.done.done():
                    job.done.set_result({"status": None, "failure": "zygote lost"})

    def _result(self, job: _Job, exit_: _Exit) -> SandboxResult:
        def failed(code: str, message: str, retryable: bool) -> SandboxResult:
            return SandboxResult([], code, message, retryable, exit_.duration_ms or 0, peak)

        peak = -(-(exit_.maxrss_kib or 0) // 1024)
        if job.cancelled:
            return failed("CANCELLED", "The job was cancelled.", False)
        if exit_.status is None:
            return failed("SANDBOX_CRASHED", "The job's sandbox was lost; it will be retried.", True)
        report = _parse_report(exit_.report)
        if report is not None and report.get("netns") is False and not self._warned_network:
            self._warned_network = True
            log.warning("sandbox: network namespace isolation failed; jobs keep the host network")
        if report is not None and report.get("mountns") is False and not self._warned_files:
            self._warned_files = True
            log.warning("sandbox: mount namespace refused; jobs can write the shared temp directories")
        if report is not None and report.get("ok") is True:
            try:
                outputs = [self._output(job, raw) for raw in report.get("outputs", [])]
            except (TypeError, ValueError) as exc:
                log.error("sandbox job %s returned invalid outputs: %s", job.job_id, exc)
                return failed("INTERNAL", "Internal error.", False)
            return SandboxResult(outputs, None, None, False, exit_.duration_ms or 0, peak)
        if report is not None and report.get("ok") is False:
            if report.get("traceback"):
                log.error("sandbox job %s failed:\n%s", job.job_id, report["traceback"])
            return failed(
                str(report.get("error_code") or "INTERNAL"),
                str(report.get("message") or "Internal error."),
                bool(report.get("retryable", False)),
            )
        signum = -1
        if os.WIFSIGNALED(exit_.status):
            signum = os.WTERMSIG(exit_.status)
        if job.timed_out:
            return failed("TIMEOUT", "The job exceeded its time limit.", True)
        if signum == signal.SIGXCPU or (
            signum == signal.SIGKILL and (exit_.cpu_seconds or 0) >= job.limits.cpu_seconds
        ):
            return failed("TIMEOUT", "The job exceeded its CPU time limit.", True)
        if signum == signal.SIGXFSZ:
            return failed("RESOURCE_LIMIT", "The job exceeded its file size limit.", False)
        log.error(
            "sandbox job %s died without a report: status=%s signal=%s failure=%s",
            job.job_id,
            exit_.status,
            signal.Signals(signum).name if signum > 0 else None,
            exit_.failure,
        )
        return failed("SANDBOX_CRASHED", "The job's sandbox crashed.", False)

    @staticmethod
    def _output(job: _Job, raw: Any) -> OutputFile:
        if not isinstance(raw, dict):
            raise TypeError("output is not an object")
        output = OutputFile(**raw)
        name = output.filename
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"output filename {name!r} is not a plain name")
        try:
            fd, _ = _open_output(job.output_dir.parent, name)
            os.close(fd)
        except OSError as exc:
            raise ValueError(f"output {name!r} is not a regular file inside output/: {exc}") from None
        if not isinstance(output.metadata, dict):
            raise TypeError("output metadata is not an object")
        return output


PROGRESS_FILE: Final = "progress"
"""File in the job dir where an entry reports how far it is (:func:`report_progress`)."""
_PROGRESS_MIN_INTERVAL: Final = 0.5
_progress_written: dict[str, tuple[float, float]] = {}


def report_progress(out_dir: Path, fraction: float) -> None:
    """Called by an entry, in the sandbox child: reports that ``fraction`` (0–1) of its work is
    done, for the worker to turn into job progress events while the child runs
    (:func:`read_progress`). Writes ``{job_dir}/progress`` (``out_dir``'s parent) as a decimal
    number, atomically (a temporary file renamed over it); at most every 0.5 s, except 1.0.
    Best effort: an ``OSError`` (a full disk) is ignored — progress never fails a job."""
    fraction = min(1.0, max(0.0, float(fraction))) if math.isfinite(fraction) else 0.0
    key = str(out_dir)
    now = time.monotonic()
    last = _progress_written.get(key)
    if (
        last is not None
        and fraction < 1.0
        and (now - last[0] < _PROGRESS_MIN_INTERVAL or fraction <= last[1])
    ):
        return
    _progress_written[key] = (now, fraction)
    job_dir = Path(out_dir).parent
    tmp = job_dir / f".{PROGRESS_FILE}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(f"{fraction:.4f}")
        os.replace(tmp, job_dir / PROGRESS_FILE)


def read_progress(job_dir: Path) -> float | None:
    """The fraction an entry last reported with :func:`report_progress` (0–1), or ``None`` when
    it reported nothing readable. The file is written by the job, so it is opened without
    following a symlink and without blocking (a FIFO), read only if it is a regular file, at most
    32 bytes, and parsed as a finite number in 0–1; anything else is ``None``."""
    try:
        fd = os.open(job_dir / PROGRESS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, 32)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = float(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def read_output(job_dir: Path, filename: str, *, max_bytes: int = 1 << 40) -> bytes:
    """The bytes of ``{job_dir}/output/{filename}``, opened without following a symlink at any
    step (the job dir, ``output/`` and the file are each opened with ``O_NOFOLLOW`` relative to
    the previous one), and only if it is a regular file with a single link. A job that replaced
    ``output/`` or its file with a symlink, or hard-linked something in, gets an error, never the
    bytes of a file elsewhere (the worker reading outputs may have more rights than the job).

    Args:
        max_bytes: read at most this many bytes.

    Raises:
        OSError: see :func:`_open_output`.
    """
    fd, size = _open_output(job_dir, filename)
    try:
        chunks = []
        remaining = min(max_bytes, size)
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _open_output(job_dir: Path, filename: str) -> tuple[int, int]:
    """``(fd, size in bytes)`` of ``{job_dir}/output/{filename}``: a read-only fd, opened as
    :func:`read_output` describes and checked to be a regular, singly linked file; the caller
    closes it.

    Raises:
        OSError: ``ELOOP`` for a symlink, ``ENOTDIR``, ``ENOENT``, or ``EPERM`` when the file is not
            a regular, singly linked file.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(job_dir, flags | os.O_DIRECTORY)
    try:
        out_fd = os.open("output", flags | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            fd = os.open(filename, flags | os.O_NONBLOCK, dir_fd=out_fd)
        finally:
            os.close(out_fd)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular, singly linked file")
    except OSError:
        os.close(fd)
        raise
    return fd, info.st_size


def _unavailable(message: str) -> SandboxResult:
    """The result of a job whose sandbox could not be had: retryable, nothing ran."""
    return SandboxResult([], "SANDBOX_UNAVAILABLE", message, True, 0, 0)


def _exit_from_event(event: dict[str, Any]) -> _Exit:
    return _Exit(
        status=event.get("status"),
        maxrss_kib=int(event.get("maxrss_kib") or 0),
        cpu_seconds=float(event.get("cpu_seconds") or 0.0),
        duration_ms=int(event.get("duration_ms") or 0),
        report=event.get("report"),
        failure=event.get("failure"),
    )


def _parse_report(report: str | None) -> dict[str, Any] | None:
    if not report:
        return None
    try:
        parsed = json.loads(report)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


@functools.lru_cache(maxsize=256)
def _primary_gid(uid: int) -> int:
    """The uid's group from passwd; a uid without an entry (a pool member) gets gid = uid."""
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def _check_reachable(path: Path, uid: int) -> None:
    """Raises ValueError unless ``uid`` may search every directory from / down to ``path``."""
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == uid or st.st_mode & stat.S_IXOTH:
            continue
        raise ValueError(
            f"sandbox uid {uid} cannot reach {path}: {directory} is not searchable by others (chmod o+x)"
        )


# ================================================================================================
# Zygote side: everything below runs in the zygote process or in its children.
# ================================================================================================

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


@dataclass
class _Child:
    job_id: str
    pid: int
    report_fd: int
    started: float
    report: bytearray = field(default_factory=bytearray)
    overflow: bool = False
    uid: int | None = None


def _zygote_main() -> NoReturn:
    """Entry point of the zygote process (``python -c``); argv[1] is a JSON list of modules, argv[2]
    whether to sweep leftover processes of finished jobs (JSON bool, see :meth:`_Zygote.sweep_orphans`)."""
    for module in json.loads(sys.argv[1]):
        importlib.import_module(module)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    make_undumpable()
    gc.freeze()  # keeps preloaded objects out of GC passes, so children share their pages longer
    _Zygote(sweep=json.loads(sys.argv[2])).serve()


class _Zygote:
    def __init__(self, *, sweep: bool) -> None:
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, _Child] = {}
        self.by_job: dict[str, _Child] = {}
        self.inbox = bytearray()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (0, self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(0, selectors.EVENT_READ, "control")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "sigchld")
        self.sweep = sweep
        """Kill leftover processes of finished jobs (the sandbox has its own uid pool)."""

    def emit(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            written = os.write(1, data)
            data = data[written:]

    def serve(self) -> NoReturn:
        self.emit({"event": "ready", "pid": os.getpid()})
        while True:
            for key, _ in self.selector.select():
                if key.data == "control":
                    self.read_control()
                elif key.data == "sigchld":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass
                    self.reap()
                elif key.data.report_fd >= 0:  # not closed by a reap() earlier in this batch
                    self.read_report(key.data)

    def read_control(self) -> None:
        try:
            data = os.read(0, 1 << 16)
        except BlockingIOError:
            return
        if not data:  # the worker closed us (or died): take every job down with us
            for child in self.children.values():
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, signal.SIGKILL)
            os._exit(0)
        self.inbox += data
        while len(self.inbox) >= _LEN.size:
            (size,) = _LEN.unpack_from(self.inbox)
            if len(self.inbox) < _LEN.size + size:
                break
            message = pickle.loads(self.inbox[_LEN.size : _LEN.size + size])
            del self.inbox[: _LEN.size + size]
            if message["op"] == "run":
                self.start_child(message)
            elif message["op"] == "kill" and message["job_id"] in self.by_job:
                # The leader is not reaped yet (reap() drops it from by_job first), so its pid
                # still names this job's group.
                with contextlib.suppress(OSError):
                    os.killpg(self.by_job[message["job_id"]].pid, signal.SIGKILL)

    def start_child(self, request: dict[str, Any]) -> None:
        report_r, report_w = os.pipe()
        started = time.monotonic()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(report_r)
            os.close(report_w)
            self.emit({"event": "exited", "job_id": request["job_id"], "status": None, "failure": str(exc)})
            return
        if pid == 0:
            try:
                os.close(report_r)
                _child_main(request, report_w)
            finally:
                os._exit(70)
        os.close(report_w)
        os.set_blocking(report_r, False)
        child = _Child(request["job_id"], pid, report_r, started, uid=request["uid"])
        self.children[pid] = child
        self.by_job[child.job_id] = child
        self.selector.register(report_r, selectors.EVENT_READ, child)
        self.emit({"event": "started", "job_id": child.job_id, "pid": pid})

    def sweep_orphans(self) -> None:
        """SIGKILL this zygote's children that are not job leaders and whose uid no running job
        holds: what the process-group kill cannot reach, such as a grandchild that called
        ``setsid`` and was reparented to the zygote (a child subreaper) when its parent died. Only
        the zygote's own children are touched — never another sandbox's processes of the same uid
        — and a child cannot be replaced by another process before the zygote reaps it, so its pid
        is safe to signal. Needs ``/proc/<pid>/task/<tid>/children`` (CONFIG_PROC_CHILDREN)."""
        me = os.getpid()
        try:
            with open(f"/proc/{me}/task/{me}/children") as fh:
                pids = [int(p) for p in fh.read().split()]
        except OSError:
            return
        held = {c.uid for c in self.children.values()}
        for pid in pids:
            if pid in self.children:
                continue
            uid = _real_uid(pid)
            if uid is not None and uid not in held:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def read_report(self, child: _Child) -> bool:
        """Reads what is available; True at EOF (fd closed and unregistered)."""
        while True:
            try:
                data = os.read(child.report_fd, 1 << 16)
            except BlockingIOError:
                return False
            if not data:
                self.selector.unregister(child.report_fd)
                os.close(child.report_fd)
                child.report_fd = -1
                return True
            if len(child.report) + len(data) > MAX_REPORT_BYTES:
                child.overflow = True
            else:
                child.report += data

    def reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            child = self.children.pop(pid, None)
            if child is not None:
                del self.by_job[child.job_id]
                # Still a zombie: the group id cannot have been reused. Take down stragglers.
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            if self.sweep:
                self.sweep_orphans()
            if child is None:
                continue  # an orphaned grandchild handed to us as subreaper
            if child.report_fd >= 0:
                self.read_report(child)
                if child.report_fd >= 0:  # a grandchild still holds the pipe: stop listening
                    self.selector.unregister(child.report_fd)
                    os.close(child.report_fd)
            report = None if child.overflow else child.report.decode("utf-8", "replace")
            self.emit(
                {
                    "event": "exited",
                    "job_id": child.job_id,
                    "status": status,
                    "maxrss_kib": usage.ru_maxrss,
                    "cpu_seconds": usage.ru_utime + usage.ru_stime,
                    "duration_ms": round((time.monotonic() - child.started) * 1000),
                    "report": report,
                    "failure": "report too large" if child.overflow else None,
                }
            )


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: this process's ``/proc/<pid>`` files become root's and it
    cannot be ptraced, so a job running under the same uid (a worker without root) cannot read its
    environment (``DATABASE_URL``) or memory. See prctl(2), proc(5)."""
    _prctl(_PR_SET_DUMPABLE, 0)


def _proc_status(pid: int | str) -> dict[bytes, bytes] | None:
    """The fields of ``/proc/<pid>/status`` (name → value), or None when the process is gone. The
    real uid is the first number of ``Uid`` (the owner of ``/proc/<pid>`` is root for a
    non-dumpable process, so it cannot be used). proc(5)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            return dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
    except OSError:
        return None


def _real_uid(pid: int | str) -> int | None:
    fields = _proc_status(pid)
    try:
        return int(fields[b"Uid"].split()[0]) if fields else None
    except (KeyError, ValueError, IndexError):
        return None


def _uid_tasks(uid: int) -> int:
    """Tasks (threads) of ``uid`` now, from ``/proc/*/status``: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        fields = _proc_status(entry.name) if entry.name.isdigit() else None
        try:
            if fields and int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (KeyError, ValueError, IndexError):
            continue
    return total


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def c(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    if _libc.mount(c(source), c(target), c(fstype), flags, c(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _code_dirs() -> tuple[str, ...]:
    """The directories the sandboxed code itself lives in: the Python environment
    (``sys.prefix``, a venv), the Python installation it was made from (``sys.base_prefix``: the
    standard library) and the checkout holding the ``hypermedia`` package. Under a covered
    directory (:func:`_covered_dirs`: a CI clone in ``/tmp``, a pyenv Python under ``/root``)
    they are bound back read-only into a job's mount namespace, so that a job may still import
    lazily (a standard library module, an extension module, a model file) what the zygote did
    not preload."""
    here = Path(__file__).resolve().parents[1]
    return tuple(sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix), str(here)}))


def _closed_ancestors(paths: tuple[str, ...]) -> tuple[str, ...]:
    """For each path, its topmost ancestor that others may not search (no ``o+x``, such as
    ``/root``, mode 0700): a job's uid could not reach the path through it. Sorted, distinct."""
    closed = set()
    for path in paths:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            ancestor = os.path.join(*parts[:depth])
            try:
                mode = os.stat(ancestor).st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                closed.add(ancestor)
                break
    return tuple(sorted(closed))


def _covered_dirs() -> tuple[str, ...]:
    """What a job's mount namespace covers with an empty read-only tmpfs (the code dirs under one
    bound back): :data:`SHARED_WRITABLE_DIRS`, and the closed ancestors of the code dirs
    (:func:`_closed_ancestors`), which are then hidden from the job but for the code in them."""
    return SHARED_WRITABLE_DIRS + tuple(
        d for d in _closed_ancestors(_code_dirs()) if d not in SHARED_WRITABLE_DIRS
    )


def _confine_files(job_dir: str, private_tmp: str | None = None) -> bool:
    """In a new mount namespace, cover each of :func:`_covered_dirs` with an empty,
    read-only, nosuid/nodev/noexec tmpfs; what lies under one of them is bound back at its path:
    the :func:`_code_dirs` read-only (nosuid/nodev), then the job dir writable. With
    ``private_tmp`` (a directory the confined uid owns), ``/tmp`` is that directory instead,
    bind-mounted writable (nosuid/nodev/noexec): for programs that insist on ``/tmp``, such as
    LibreOffice's named pipe. Needs CAP_SYS_ADMIN (root); False when the namespace is refused.
    Mount flags: mount(2), mount_namespaces(7)."""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        return False
    fds: list[int] = []
    try:
        keep = []
        for code_dir in _code_dirs():
            fds.append(os.open(code_dir, os.O_PATH | os.O_DIRECTORY))
            keep.append((code_dir, fds[-1], False))
        fds.append(os.open(job_dir, os.O_PATH | os.O_DIRECTORY))
        keep.append((job_dir, fds[-1], True))
        tmp_fd = None
        if private_tmp is not None:
            tmp_fd = os.open(private_tmp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            fds.append(tmp_fd)
        _cover_shared_dirs(keep, tmp_fd)
        return True
    except OSError:
        return False  # mount refused (a restricted container): the documented fallback
    finally:
        for fd in fds:
            os.close(fd)


def _cover_shared_dirs(keep: list[tuple[str, int, bool]], tmp_fd: int | None) -> None:
    """``keep``: ``(path, O_PATH fd, writable)`` bound back, in order, when under a covered dir."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing leaks back to the host
    hardening = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    for shared in _covered_dirs():
        if os.path.islink(shared) or not os.path.isdir(shared):
            continue
        private = shared == "/tmp" and tmp_fd is not None
        if private:
            _mount(f"/proc/self/fd/{tmp_fd}", shared, None, _MS_BIND)
        else:
            _mount("tmpfs", shared, "tmpfs", hardening, "size=16k,mode=0755")
        for path, fd, writable in keep:
            inside = os.path.relpath(path, shared)
            if inside.startswith(".."):
                continue
            target = os.path.join(shared, inside)
            os.makedirs(target, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND)
            if not writable:  # code: read-only, but its extension modules must stay mappable
                _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        if private:
            _mount(None, shared, None, _MS_REMOUNT | _MS_BIND | hardening)
        else:
            _mount(None, shared, None, _MS_REMOUNT | _MS_RDONLY | hardening, "size=16k,mode=0755")


def confined_exec_main() -> NoReturn:
    """Entry of a confined **long-lived** helper process (``python -c``), such as the docworker's
    LibreOffice listener: applies the job sandbox's confinement to itself, then ``execve``s the
    helper. Unlike a job, it has no CPU limit (the caller enforces a wall-clock timeout per request)
    and keeps stdin/stdout/stderr (its request channel).

    ``argv[1]`` is a JSON object: ``argv`` (the program and its arguments; ``argv[0]`` an absolute
    path), ``dir`` (its working directory; must exist), ``uid``/``gid`` (``null``: keep the
    caller's; else needs root), ``private_tmp`` (a directory bind-mounted over ``/tmp``, or
    ``null``), ``isolate_network`` (bool), ``memory_bytes`` (``RLIMIT_AS``), ``fsize_bytes``,
    ``nproc`` (``RLIMIT_NPROC``, relative to the uid's tasks when the uid is kept), ``env``, and
    ``landlock``: ``null``, or a list of ``[path, access]`` (:class:`hypermedia.landlock.Rule`):
    the only files the helper may open (:func:`hypermedia.landlock.restrict_self`).

    Order as in :func:`_child_main`: network namespace, mount namespace, rlimits, drop to the uid
    (no supplementary groups), ``no_new_privs``, parent-death SIGKILL (set after the uid change,
    which clears it), then the Landlock ruleset, ``umask 077``. Exits 71 when a confinement step
    fails (namespaces refused are not failures: the helper runs without them, as jobs do; a
    Landlock ruleset given but refused is one), 127 when ``execve`` fails."""
    try:
        spec = json.loads(sys.argv[1])
        parent = os.getppid()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        if spec["isolate_network"]:
            _libc.unshare(_CLONE_NEWNET)
        if spec["uid"] is not None:
            _confine_files(spec["dir"], spec["private_tmp"])
        _limit_and_drop(spec["memory_bytes"], spec["fsize_bytes"], spec["nproc"], spec["uid"], spec["gid"])
        if os.getppid() != parent:
            os._exit(71)
        os.chdir(spec["dir"])  # before the ruleset: the path to it need not be in the view
        if spec.get("landlock") is not None:
            landlock.restrict_self(landlock.Rule(path, access) for path, access in spec["landlock"])
        os.umask(0o077)
    except BaseException:
        traceback.print_exc()
        os._exit(71)
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError:
        traceback.print_exc()
    os._exit(127)


def kill_uid(uid: int) -> int:
    """SIGKILLs every process whose real uid is ``uid`` (found in ``/proc``); returns how many.
    Only for a uid that belongs to one confined helper alone (needs root for another uid)."""
    killed = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _real_uid(entry.name) == uid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def _limit_and_drop(
    memory_bytes: int, fsize_bytes: int, nproc: int, uid: int | None, gid: int | None
) -> None:
    """The confinement steps a job child and a confined helper share, in this order:
    ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (relative to the uid's tasks when the uid is
    kept, see :func:`_uid_tasks`), no core dumps, then (``uid`` given) no supplementary groups,
    ``gid``, ``uid``; ``no_new_privs``; parent-death SIGKILL (set last: a uid change clears it)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))
    nproc = nproc if uid is not None else _uid_tasks(os.getuid()) + nproc
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:
        assert gid is not None
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_main(request: dict[str, Any], report_fd: int) -> NoReturn:
    """Runs in the forked child: confine, run the entry, write a JSON report, exit."""
    report: dict[str, Any]
    netns: bool | None = None
    mountns: bool | None = None
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        zygote_pid = os.getppid()
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(report_fd, 3)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        report_fd = 3
        if request["isolate_network"]:
            netns = _libc.unshare(_CLONE_NEWNET) == 0
        if request["uid"] is not None:
            mountns = _confine_files(request["job_dir"])
        limits = request["limits"]
        cpu = int(limits["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        _limit_and_drop(
            limits["memory_bytes"], limits["fsize_bytes"], limits["nproc"], request["uid"], request["gid"]
        )
        if os.getppid() != zygote_pid:
            os._exit(71)
        os.umask(0o077)
        os.chdir(request["job_dir"])
        os.environ.clear()
        os.environ.update(request["env"])

        module_name, _, function_name = request["entry"].partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        operation, params, input_path, output_dir = request["args"]
        outputs = function(operation, params, Path(input_path), Path(output_dir), **request["kwargs"])
        report = {"ok": True, "outputs": [_output_dict(o) for o in outputs]}
    except DomainError as exc:
        report = {
            "ok": False,
            "error_code": exc.error_code,
            "message": exc.public_message,
            "retryable": exc.retryable,
        }
    except MemoryError:
        report = {
            "ok": False,
            "error_code": "RESOURCE_LIMIT",
            "message": "The job exceeded its memory limit.",
        }
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            report = {
                "ok": False,
                "error_code": "RESOURCE_LIMIT",
                "message": "The job exceeded its file size limit.",
            }
        else:
            report = _internal_report()
    except BaseException:
        report = _internal_report()
    report["netns"] = netns
    report["mountns"] = mountns
    try:
        data = json.dumps(report, allow_nan=False).encode()
    except (TypeError, ValueError):
        data = json.dumps(_internal_report()).encode()
    while data:
        data = data[os.write(report_fd, data) :]
    os._exit(0)


def _internal_report() -> dict[str, Any]:
    """An unexpected exception: the traceback goes to the worker's log, a generic message to the user."""
    return {
        "ok": False,
        "error_code": "INTERNAL",
        "message": "Internal error.",
        "traceback": traceback.format_exc(),
    }


def _output_dict(output: Any) -> dict[str, Any]:
    if not isinstance(output, OutputFile):
        raise TypeError(f"entry returned {type(output).__name__}, not OutputFile")
    return dataclasses.asdict(output)
