"""The zygote process: imports the preload modules once, forks one child per job (ahead of the
job: :class:`_Spare`), reaps it with ``wait4`` and reports its exit as a JSON line. The child's
side (confinement, the entry, the report) is :mod:`hypermedia.sandbox.child`."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import pickle
import selectors
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from hypermedia.sandbox import cgroups
from hypermedia.sandbox.child import _child_main, _spare_main
from hypermedia.sandbox.confine import (
    _PR_SET_CHILD_SUBREAPER,
    _PR_SET_PDEATHSIG,
    _prctl,
    _real_uid,
    make_undumpable,
)
from hypermedia.sandbox.host import _LEN, MAX_REPORT_BYTES


@dataclass
class _Child:
    job_id: str
    pid: int
    report_fd: int
    started: float
    report: bytearray = field(default_factory=bytearray)
    overflow: bool = False
    uid: int | None = None
    cgroup: cgroups.JobCgroup | None = None
    oom_seen: bool = False
    cpu_at_kill: float = 0.0
    """The CPU seconds its process group had used when the zygote killed it (:func:`_group_cpu_seconds`):
    a killed child's ``wait4`` rusage lacks what its own children used and never waited for."""


@dataclass
class _Spare:
    """A child forked ahead of its job (ADR 0053): already in a cgroup of its own (joining one
    waits for an RCU grace period in the kernel, 5–20 ms on this machine's cgroup v1, which a
    job no longer waits for), it blocks on ``request_fd`` until the zygote hands it a job's
    request, then goes on as :func:`_child_main`."""

    pid: int
    request_fd: int
    """The write end of the pipe its request comes through."""
    report_fd: int
    """The read end of its report pipe."""
    group: cgroups.JobCgroup | None


SPARE_MEMORY_BYTES: Final = 256 << 20
SPARE_PIDS: Final = 16
"""The limits of a spare's group until a job's own are set at hand-off: the spare is a forked,
idle zygote (its pages charged where the zygote's are, until written)."""
SPARE_FAILURES_MAX: Final = 3
"""Spares that may die before their job (killed from outside) before the zygote stops making
them and forks each child at its request, as before."""


def _zygote_main() -> NoReturn:
    """Entry point of the zygote process (``python -c``); argv[1] is a JSON list of modules, argv[2]
    whether to sweep leftover processes of finished jobs (JSON bool, see :meth:`_Zygote.sweep_orphans`),
    argv[3] the job cgroups' config (:meth:`hypermedia.sandbox.cgroups.Cgroups.config`) or null."""
    for module in json.loads(sys.argv[1]):
        importlib.import_module(module)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    make_undumpable()
    gc.freeze()  # keeps preloaded objects out of GC passes, so children share their pages longer
    config = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    _Zygote(sweep=json.loads(sys.argv[2]), groups=cgroups.from_config(config) if config else None).serve()


class _Zygote:
    def __init__(self, *, sweep: bool, groups: cgroups.Cgroups | None = None) -> None:
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
        self.groups = groups
        """Where job cgroups are made; None: RLIMIT_AS only."""
        self.pending = cgroups.PendingRemovals()
        self.spare: _Spare | None = None
        self.spare_seq = 0
        self.spare_failures = 0

    def emit(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            written = os.write(1, data)
            data = data[written:]

    def serve(self) -> NoReturn:
        self.fork_spare()
        self.emit({"event": "ready", "pid": os.getpid()})
        while True:
            for key, _ in self.selector.select():
                if key.data == "control":
                    self.read_control()
                elif isinstance(key.data, tuple):  # ("oom", child): a v1 group hit its limit
                    self.group_oom(key.data[1])
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
                if child.cgroup is not None:
                    child.cgroup.kill_all()
                    self.pending.groups.append(child.cgroup)
            self.drop_spare()
            self.pending.retry()
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
                # still names this job's group; the leader itself too, for a kill that comes
                # before its setsid() (a child still taking its request).
                child = self.by_job[message["job_id"]]
                pid = child.pid
                with contextlib.suppress(OSError):  # held still while counted: nothing runs or reaps
                    os.killpg(pid, signal.SIGSTOP)
                child.cpu_at_kill = _group_cpu_seconds(pid)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def fork_spare(self) -> None:
        """Forks the next job's child ahead of its request (:class:`_Spare`), in a group of its
        own when there are cgroups. Nothing when a spare exists, when too many died unused, or
        when the group or the fork fails: the next job's child is then forked at its request."""
        if self.spare is not None or self.spare_failures >= SPARE_FAILURES_MAX:
            return
        group = None
        if self.groups is not None:
            self.spare_seq += 1
            try:
                group = self.groups.create(
                    f"spare-{os.getpid()}-{self.spare_seq}", SPARE_MEMORY_BYTES, SPARE_PIDS
                )
            except cgroups.CgroupError:
                return
        request_r, request_w = os.pipe()
        report_r, report_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (request_r, request_w, report_r, report_w):
                os.close(fd)
            if group is not None:
                group.remove()
            return
        if pid == 0:
            try:
                os.close(request_w)
                os.close(report_r)
                _spare_main(request_r, report_w, group.procs_files if group is not None else None)
            finally:
                os._exit(70)
        os.close(request_r)
        os.close(report_w)
        self.spare = _Spare(pid, request_w, report_r, group)

    def drop_spare(self, *, reaped: bool = False) -> None:
        """Kills and forgets the spare (the zygote is exiting, or the spare died unused: then it
        is ``reaped`` already and its pid is not signalled, since it may name another process)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return
        if not reaped:
            with contextlib.suppress(OSError):
                os.kill(spare.pid, signal.SIGKILL)
                os.waitpid(spare.pid, 0)  # out of its group before the group is removed
        for fd in (spare.request_fd, spare.report_fd):
            os.close(fd)
        if spare.group is not None:
            spare.group.kill_all()
            if not spare.group.remove():
                self.pending.groups.append(spare.group)

    def start_child(self, request: dict[str, Any]) -> None:
        if self.spare is not None:
            self.hand_to_spare(request)
        else:
            self.fork_child(request)
        self.fork_spare()

    def hand_to_spare(self, request: dict[str, Any]) -> None:
        """Gives ``request`` to the spare: the job's limits on its group, then the request down
        its pipe; it is the job's child from then on."""
        spare, self.spare = self.spare, None
        assert spare is not None
        group = spare.group
        if group is not None:
            limits = request["limits"]
            try:
                group.set_limits(limits["cgroup_memory_bytes"] or limits["memory_bytes"], limits["pids"])
            except cgroups.CgroupError as exc:
                self.spare = spare
                self.drop_spare()
                self.emit(
                    {
                        "event": "exited",
                        "job_id": request["job_id"],
                        "status": None,
                        "failure": f"cgroup: {exc}",
                    }
                )
                return
        request["cgroup"] = group.procs_files if group is not None else None
        data = pickle.dumps(request)
        try:
            os.write(spare.request_fd, _LEN.pack(len(data)))
            while data:
                data = data[os.write(spare.request_fd, data) :]
        except OSError:  # the spare died: its exit is reaped as the job's
            pass
        os.close(spare.request_fd)
        self.track(request["job_id"], spare.pid, spare.report_fd, time.monotonic(), request["uid"], group)

    def track(
        self,
        job_id: str,
        pid: int,
        report_fd: int,
        started: float,
        uid: int | None,
        group: cgroups.JobCgroup | None,
    ) -> None:
        """Registers a job's child (its report pipe, its group's OOM eventfd) and says it started."""
        os.set_blocking(report_fd, False)
        child = _Child(job_id, pid, report_fd, started, uid=uid, cgroup=group)
        self.children[pid] = child
        self.by_job[child.job_id] = child
        self.selector.register(report_fd, selectors.EVENT_READ, child)
        if group is not None and group.oom_fd is not None:
            self.selector.register(group.oom_fd, selectors.EVENT_READ, ("oom", child))
        self.emit({"event": "started", "job_id": child.job_id, "pid": pid})

    def fork_child(self, request: dict[str, Any]) -> None:
        """Forks a job's child at its request (no spare was ready): makes its group, which the
        child joins first."""
        group = None
        if self.groups is not None:
            limits = request["limits"]
            try:
                group = self.groups.create(
                    request["job_id"], limits["cgroup_memory_bytes"] or limits["memory_bytes"], limits["pids"]
                )
            except cgroups.CgroupError as exc:
                self.emit(
                    {
                        "event": "exited",
                        "job_id": request["job_id"],
                        "status": None,
                        "failure": f"cgroup: {exc}",
                    }
                )
                return
        request["cgroup"] = group.procs_files if group is not None else None
        report_r, report_w = os.pipe()
        started = time.monotonic()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(report_r)
            os.close(report_w)
            if group is not None:
                group.remove()
            self.emit({"event": "exited", "job_id": request["job_id"], "status": None, "failure": str(exc)})
            return
        if pid == 0:
            try:
                os.close(report_r)
                _child_main(request, report_w)
            finally:
                os._exit(70)
        os.close(report_w)
        self.track(request["job_id"], pid, report_r, started, request["uid"], group)

    def group_oom(self, child: _Child) -> None:
        """A v1 job group ran out of memory: kill all of it (what v2's ``memory.oom.group`` does),
        so a job never runs on with a part of it OOM-killed."""
        assert child.cgroup is not None and child.cgroup.oom_fd is not None
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(child.cgroup.oom_fd)
        child.oom_seen = True
        child.cgroup.kill_all()

    def release_group(self, child: _Child) -> tuple[int | None, bool]:
        """After the leader is reaped: reads the group's peak and OOM record, kills what is left
        in it (grandchildren that left the process group too), removes it. Returns ``(peak bytes,
        OOM-killed)``."""
        group = child.cgroup
        if group is None:
            return None, False
        peak, oom = group.peak_bytes(), child.oom_seen or group.oom_killed()
        if group.oom_fd is not None:
            self.selector.unregister(group.oom_fd)
        group.kill_all()
        if not group.remove():
            self.pending.groups.append(group)
        return peak, oom

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
        spare = self.spare.pid if self.spare is not None else None
        for pid in pids:
            if pid in self.children or pid == spare:
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
            if self.pending.groups:
                self.pending.retry()
            if child is None:
                if self.spare is not None and pid == self.spare.pid:  # killed before its job
                    self.spare_failures += 1
                    self.drop_spare(reaped=True)
                    self.fork_spare()
                continue  # an orphaned grandchild handed to us as subreaper
            peak, oom = self.release_group(child)
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
                    "cpu_seconds": max(usage.ru_utime + usage.ru_stime, child.cpu_at_kill),
                    "duration_ms": round((time.monotonic() - child.started) * 1000),
                    "report": report,
                    "failure": "report too large" if child.overflow else None,
                    "cgroup_peak_bytes": peak,
                    "oom_killed": oom,
                }
            )


def _group_cpu_seconds(pgid: int) -> float:
    """The CPU seconds (user + system) used by the processes of group ``pgid`` and by the children
    they have waited for (psutil's ``cpu_times``: ``/proc/<pid>/stat``'s ``utime``, ``stime``,
    ``cutime``, ``cstime``). A job whose engine runs each page in a process of its own (OCR's
    tesseract) keeps its finished pages' CPU in its own ``cutime``, which its parent's ``wait4``
    reports only when the parent reaps it, and a kill leaves no time for that. A process that
    left the group (``setsid``, ``setpgid``) is not counted: it can only make the job cheaper.
    0.0 when ``/proc`` cannot be read: never an error of the zygote's. psutil is imported here,
    at the first kill, not into the zygote every child is forked from."""
    import psutil

    seconds = 0.0
    try:
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) != pgid:
                    continue
                times = process.cpu_times()
            except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
                continue
            seconds += times.user + times.system + times.children_user + times.children_system
    except (psutil.Error, OSError):  # an emulated /proc (gVisor) must not stop the kill
        return 0.0
    return seconds
