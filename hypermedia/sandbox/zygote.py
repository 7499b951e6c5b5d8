"""The zygote process and the per-job child it forks: the zygote imports the preload modules once,
forks one child per job, reaps it with ``wait4`` and reports its exit as a JSON line; the child
confines itself (:mod:`hypermedia.sandbox.confine`) and calls the entry (see :mod:`hypermedia.sandbox`)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import importlib
import json
import os
import pickle
import resource
import selectors
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from hypermedia.core.errors import DomainError
from hypermedia.engines.contract import OutputFile
from hypermedia.sandbox import cgroups, landlock, seccomp
from hypermedia.sandbox.confine import (
    _PR_SET_CHILD_SUBREAPER,
    _PR_SET_NO_NEW_PRIVS,
    _PR_SET_PDEATHSIG,
    _confine_files,
    _prctl,
    _real_uid,
    _uid_tasks,
    detach_code_dirs,
    drop_capabilities,
    enter_namespaces,
    make_undumpable,
    mount_proc,
    set_limits,
)
from hypermedia.sandbox.host import _LAYERS, _LEN, MAX_REPORT_BYTES


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
                # still names this job's group.
                with contextlib.suppress(OSError):
                    os.killpg(self.by_job[message["job_id"]].pid, signal.SIGKILL)

    def start_child(self, request: dict[str, Any]) -> None:
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
        os.set_blocking(report_r, False)
        child = _Child(request["job_id"], pid, report_r, started, uid=request["uid"], cgroup=group)
        self.children[pid] = child
        self.by_job[child.job_id] = child
        self.selector.register(report_r, selectors.EVENT_READ, child)
        if group is not None and group.oom_fd is not None:
            self.selector.register(group.oom_fd, selectors.EVENT_READ, ("oom", child))
        self.emit({"event": "started", "job_id": child.job_id, "pid": pid})

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
            if self.pending.groups:
                self.pending.retry()
            if child is None:
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
                    "cpu_seconds": usage.ru_utime + usage.ru_stime,
                    "duration_ms": round((time.monotonic() - child.started) * 1000),
                    "report": report,
                    "failure": "report too large" if child.overflow else None,
                    "cgroup_peak_bytes": peak,
                    "oom_killed": oom,
                }
            )


def _child_main(request: dict[str, Any], report_fd: int) -> NoReturn:
    """Runs in the forked child: confine, run the entry, write a JSON report, exit.

    Order (docs/adr/0041): root clones the code dirs as detached mounts and drops to the slot
    uid; then a user
    namespace owning new network, mount, IPC and PID namespaces (:func:`enter_namespaces`), the
    mount confinement (without root: in that user namespace), pid 1 of the PID namespace
    (:func:`_spawn_init`), then a fork: this process waits for the job and ends as it did
    (:func:`_wait_and_mirror`). The job mounts its own ``/proc``, sets the rlimits, drops every
    capability, sets ``no_new_privs``, applies Landlock (read everywhere, write in the job dir)
    and the seccomp filter (:mod:`hypermedia.sandbox.seccomp`), then runs the entry."""
    report: dict[str, Any]
    layers: dict[str, bool | None] = dict.fromkeys(_LAYERS)
    try:
        cgroups.join_job_cgroup(request["cgroup"])
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
        job_dir = request["job_dir"]
        hide = (os.path.dirname(job_dir),)  # jobs/: the other jobs' directories
        trees = None
        if request["uid"] is not None:
            # Root: the code dirs may lie under a directory the slot uid cannot search (/root):
            # root clones them as detached mounts, moved into the job's mount namespace below;
            # on a kernel without open_tree, root makes the mount namespace itself (the user
            # namespace's copies it, locked). Then the slot uid: both paths go on unprivileged.
            trees = detach_code_dirs()
            if trees is None:
                layers["mountns"] = _confine_files(job_dir, hide=hide)
            os.setgroups([])
            os.setgid(request["gid"])
            os.setuid(request["uid"])
        isolate_network = bool(request["isolate_network"])
        userns = enter_namespaces(network=isolate_network)
        layers.update(userns=userns, ipcns=userns, pidns=False, netns=userns if isolate_network else None)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid and namespace changes: they clear it
        if os.getppid() != zygote_pid:
            os._exit(71)
        if not userns and layers["mountns"] is None:
            layers["mountns"] = False  # the worker is told once (Sandbox._result)
            for fd in (trees or {}).values():
                os.close(fd)
        if userns:
            if layers["mountns"] is None:
                layers["mountns"] = _confine_files(job_dir, new_namespace=False, hide=hide, trees=trees)
            # The job is always forked: after unshare(CLONE_NEWPID) this process can no longer
            # make threads (clone(2): EINVAL), and libvips needs them.
            init, lifeline = _spawn_init()
            layers["pidns"] = True
            pid = os.fork()
            if pid:
                os.close(report_fd)
                _wait_and_mirror(pid, init)
            os.close(lifeline)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            layers["procns"] = mount_proc()
        limits = request["limits"]
        nproc = limits["nproc"]
        if not userns and request["uid"] is None:
            nproc += _uid_tasks(os.getuid())  # counted with the worker's and every job's tasks
        set_limits(limits["memory_bytes"], limits["fsize_bytes"], nproc)
        cpu = int(limits["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        drop_capabilities()
        layers["caps_dropped"] = True
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        try:
            landlock.restrict_self(_landlock_rules(job_dir))
            layers["landlock"] = True
        except landlock.LandlockUnavailable:
            layers["landlock"] = False
        seccomp.install()
        layers["seccomp"] = True
        os.umask(0o077)
        os.chdir(job_dir)
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
    report.update(layers)
    try:
        data = json.dumps(report, allow_nan=False).encode()
    except (TypeError, ValueError):
        data = json.dumps({**_internal_report(), **layers}).encode()
    while data:
        data = data[os.write(report_fd, data) :]
    os._exit(0)


def _landlock_rules(job_dir: str) -> list[landlock.Rule]:
    """What a job may open: everything for reading and executing (the code, its libraries, the
    fonts and models the engines load lazily), the job dir for writing, and ``/dev/null``."""
    return [
        landlock.Rule("/", landlock.READ_EXECUTE),
        landlock.Rule(job_dir, landlock.READ_WRITE),
        landlock.Rule(os.devnull, landlock.READ_WRITE),
    ]


INIT_PROGRAM: Final = "/usr/bin/cat"
"""pid 1 of a job's PID namespace (GNU coreutils), reading a pipe only the job's parent can write
to: started with ``posix_spawn`` (a vfork, not a copy of the zygote's page tables as a fork
would be: about 3 ms saved per job here). It ignores every signal sent from inside the namespace
(pid_namespaces(7)); the job's parent SIGKILLs it when the job has exited, and should the parent
die first (its parent-death signal), the pipe's end makes it exit. Either way the kernel then
kills what is left in the namespace."""


def _spawn_init() -> tuple[int | None, int]:
    """Starts :data:`INIT_PROGRAM` as pid 1 of the PID namespace made for this process's children.
    Returns its host pid (None when it cannot be started: the job, forked next, is then pid 1
    itself) and the write end of its stdin, which the job must close. The job should not be
    pid 1: the kernel drops signals a namespace's init has no handler for, so an ``abort()`` or
    a ``kill(getpid(), sig)`` of its own would not end it."""
    lifeline_r, lifeline_w = os.pipe()
    try:
        pid = os.posix_spawn(
            INIT_PROGRAM,
            (INIT_PROGRAM,),
            {},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, lifeline_r, 0),
                (os.POSIX_SPAWN_CLOSE, lifeline_r),
                (os.POSIX_SPAWN_CLOSE, lifeline_w),
                (os.POSIX_SPAWN_CLOSE, 3),
            ],
        )
    except OSError:
        pid = None
    os.close(lifeline_r)
    return pid, lifeline_w


def _wait_and_mirror(pid: int, init: int | None) -> NoReturn:
    """The job's parent (outside its PID namespace): waits for the job, SIGKILLs and reaps the
    namespace's init, and ends the same way as the job, by exit code or by the same signal
    (``SIGSYS`` of a seccomp kill, ``SIGXCPU`` of the CPU limit), so that the zygote's ``wait4``
    sees the job's status; its rusage covers the waited job (getrusage(2): a waited descendant's
    ``ru_maxrss`` and CPU times count)."""
    _, status = os.waitpid(pid, 0)
    if init is not None:
        with contextlib.suppress(OSError):
            os.kill(init, signal.SIGKILL)
            os.waitpid(init, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            if signum != signal.SIGKILL:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
            os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 70)


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
