"""The worker side of the sandbox: :class:`Sandbox` (starts the zygote, sends it jobs, enforces wall-clock
timeouts and cancellation, turns its reports into :class:`SandboxResult`), and reading what a job
left behind (:mod:`hypermedia.sandbox.outputs`) without trusting it. Runs in the asyncio
worker; never forks and never runs an engine (see :mod:`hypermedia.sandbox`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import pickle
import pwd
import re
import shutil
import signal
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from opentelemetry import trace

from hypermedia.core import metrics
from hypermedia.engines.contract import JOB_CPU_VARIABLE, OutputFile
from hypermedia.sandbox.cgroups import Cgroups, Unavailable, open_cgroups
from hypermedia.sandbox.confine import _check_reachable, _primary_gid
from hypermedia.sandbox.outputs import open_output
from hypermedia.sandbox.results import ChildExit, SandboxLimits, SandboxResult
from hypermedia.sandbox.spans import emit as emit_spans

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

_LAYERS: Final = (
    "userns",
    "netns",
    "mountns",
    "ipcns",
    "pidns",
    "procns",
    "caps_dropped",
    "landlock",
    "seccomp",
)
"""The layer fields of a child's report (``hypermedia.sandbox.zygote.LAYERS``)."""

ZYGOTE_START_SECONDS: Final = 60.0
"""How long a (re)start of the zygote may take to import its preload modules and say it is ready
(measured here: 0.3–1.5 s for the media and OCR preloads, several times that on a loaded
machine); past it the start fails and the job is ``SANDBOX_UNAVAILABLE``."""

ZYGOTE_RESTARTS_PER_RUN: Final = 2
"""How often :meth:`Sandbox.run` restarts a zygote found dead, or lost before the job's child was
forked, before it gives the job ``SANDBOX_UNAVAILABLE``: a job that arrives while the zygote
restarts waits for the restart instead of failing an attempt."""


@dataclass
class _Job:
    job_id: str
    output_dir: Path
    limits: SandboxLimits
    done: asyncio.Future[dict[str, Any]]
    pid: int | None = None
    cancelled: bool = False
    timed_out: bool = False


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
        isolate_network: give each child an empty network namespace (owned by its user
            namespace: no root needed). On failure the job runs anyway and a warning is logged
            once.
        env: environment of the children (replaces, never extends, the worker's).
        cgroups: ``HM_SANDBOX_CGROUP``: ``auto``, ``off`` or a cgroup path (see
            :func:`hypermedia.sandbox.cgroups.open_cgroups`): each job gets its own cgroup with
            ``limits.cgroup_memory_bytes`` (swap 0), ``limits.pids`` and group OOM kill. Where
            nothing is delegated the jobs run with the rlimits alone and :attr:`cgroups_status`
            says why (logged once at :meth:`start`).
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        preload: Sequence[str] = ("pyvips", "hypermedia.engines.imaging.ops"),
        uid: int | Sequence[int] | None = None,
        isolate_network: bool = True,
        env: Mapping[str, str] = DEFAULT_CHILD_ENV,
        cgroups: str = "off",
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
        self.isolate_network = isolate_network
        self.env = dict(env)
        self._leases: dict[str, int] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._jobs: dict[str, _Job] = {}
        self._warned_network = False
        self._warned_files = False
        self._restart = asyncio.Lock()
        self.cgroup_setting = cgroups
        self._cgroups: Cgroups | Unavailable | None = None

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

    @property
    def cgroups_status(self) -> str:
        """One line: where job cgroups are made (``cgroup v1: memory at …``) or ``unavailable: <reason>``;
        ``not started`` before :meth:`start`."""
        if self._cgroups is None:
            return "not started"
        if isinstance(self._cgroups, Unavailable):
            return f"unavailable: {self._cgroups.reason}"
        return self._cgroups.describe()

    def _open_cgroups(self) -> Cgroups | None:
        """Opens the job cgroups once per sandbox (the base groups outlive zygote restarts)."""
        if self._cgroups is None:
            self._cgroups = open_cgroups(self.cgroup_setting)
            if isinstance(self._cgroups, Unavailable):
                if self.cgroup_setting != "off":
                    log.warning("sandbox: no per-job cgroups, RLIMIT_AS only: %s", self._cgroups.reason)
            else:
                log.info("sandbox: per-job cgroups, %s", self._cgroups.describe())
        return None if isinstance(self._cgroups, Unavailable) else self._cgroups

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
        groups = self._open_cgroups()
        zygote_env = dict(self.env)
        zygote_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from hypermedia.sandbox.zygote import _zygote_main; _zygote_main()",
            json.dumps(list(self.preload)),
            json.dumps(self._sweep_uids),
            json.dumps(groups.config() if groups is not None else None),
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
        ``SANDBOX_CRASHED`` (retryable). The base cgroups are removed when the zygote is gone."""
        await self._stop_zygote()
        if self._cgroups is not None and not isinstance(self._cgroups, Unavailable):
            self._cgroups.close()
        self._cgroups = None

    async def _stop_zygote(self) -> None:
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
                "env": {
                    **self.env,
                    "HOME": str(job_dir),
                    "TMPDIR": str(job_dir),
                    JOB_CPU_VARIABLE: str(limits.cpu_seconds),
                },
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
                    result = self._result(job, ChildExit.from_event(event))
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
                await self._stop_zygote()
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

    def _result(self, job: _Job, exit_: ChildExit) -> SandboxResult:
        def failed(code: str, message: str, retryable: bool, killed: str = "") -> SandboxResult:
            if killed:  # a limit or fence stopped the child: metrics.SANDBOX_KILLS' reasons
                metrics.SANDBOX_KILLS.labels(killed).inc()
            ms, cgroup = exit_.duration_ms or 0, exit_.cgroup_peak_bytes
            return SandboxResult([], code, message, retryable, ms, peak, layers, cgroup, killed)

        peak = -(-(exit_.maxrss_kib or 0) // 1024)
        layers: dict[str, Any] = {}
        if job.cancelled:
            return failed("CANCELLED", "The job was cancelled.", False, "cancelled")
        if exit_.status is None and (exit_.failure or "").startswith("cgroup:"):
            log.error("sandbox job %s: its cgroup could not be made: %s", job.job_id, exit_.failure)
            return failed(
                "SANDBOX_UNAVAILABLE", "The job's sandbox could not be started; it will be retried.", True
            )
        if exit_.status is None:
            return failed("SANDBOX_CRASHED", "The job's sandbox was lost; it will be retried.", True)
        report = _parse_report(exit_.report)
        if report is not None:
            layers = {k: report[k] for k in _LAYERS if k in report}
            emit_spans(report.get("spans"), job.limits.wall_seconds)  # under sandbox.run
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
            return SandboxResult(
                outputs, None, None, False, exit_.duration_ms or 0, peak, layers, exit_.cgroup_peak_bytes
            )
        if exit_.oom_killed and not job.timed_out:
            return failed("RESOURCE_LIMIT", "The job exceeded its memory limit.", False, "memory")
        if report is not None and report.get("ok") is False:
            if report.get("traceback"):
                log.error("sandbox job %s failed:\n%s", job.job_id, report["traceback"])
            return failed(
                str(report.get("error_code") or "INTERNAL"),
                str(report.get("message") or "Internal error."),
                bool(report.get("retryable", False)),
                # MemoryError, EFBIG, CpuTimeExceeded; no other word of a child's (a compromised
                # child must not grow the metric's series).
                str(report.get("limit")) if report.get("limit") in _REPORTED_LIMITS else "",
            )
        signum = -1
        if os.WIFSIGNALED(exit_.status):
            signum = os.WTERMSIG(exit_.status)
        # Over its processes (RLIMIT_CPU counts each alone), killed at the wall clock or not.
        cpu_used_up = exit_.cpu_seconds >= job.limits.cpu_seconds
        if job.timed_out and not cpu_used_up:
            return failed("TIMEOUT", "The job exceeded its time limit.", True, "wall_time")
        if job.timed_out or signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_used_up):
            return failed("TIMEOUT", "The job exceeded its CPU time limit.", True, "cpu_time")
        if signum == signal.SIGSYS:
            log.warning("sandbox job %s was killed by the seccomp filter (a refused system call)", job.job_id)
            return failed(
                "SANDBOX_VIOLATION",
                "The job was stopped: it made a system call the sandbox refuses.",
                False,
                "seccomp",
            )
        if signum == signal.SIGXFSZ:
            return failed("RESOURCE_LIMIT", "The job exceeded its file size limit.", False, "file_size")
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
            fd, _ = open_output(job.output_dir.parent, name)
            os.close(fd)
        except OSError as exc:
            raise ValueError(f"output {name!r} is not a regular file inside output/: {exc}") from None
        if not isinstance(output.metadata, dict):
            raise TypeError("output metadata is not an object")
        return output


_REPORTED_LIMITS: Final = ("memory", "file_size", "cpu_time")


def _unavailable(message: str) -> SandboxResult:
    """The result of a job whose sandbox could not be had: retryable, nothing ran."""
    return SandboxResult([], "SANDBOX_UNAVAILABLE", message, True, 0, 0)


def _parse_report(report: str | None) -> dict[str, Any] | None:
    if not report:
        return None
    try:
        parsed = json.loads(report)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
