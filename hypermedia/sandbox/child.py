"""The job's side of the sandbox: the child the zygote forks for a job, ahead of it as a spare
(:func:`_spare_main`), which confines itself (:mod:`hypermedia.sandbox.confine`), runs the entry
and writes its JSON report (:func:`_child_main`), with pid 1 of its PID namespace
(:func:`_spawn_init`). See :mod:`hypermedia.sandbox` and docs/adr/0041, 0053."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import importlib
import json
import os
import pickle
import resource
import signal
import time
import traceback
from pathlib import Path
from typing import Any, Final, NoReturn

from hypermedia.core.errors import CpuTimeExceeded, DomainError
from hypermedia.engines.contract import OutputFile
from hypermedia.sandbox import cgroups, landlock, seccomp, spans
from hypermedia.sandbox.confine import (
    _PR_SET_NO_NEW_PRIVS,
    _PR_SET_PDEATHSIG,
    _confine_files,
    _prctl,
    _uid_tasks,
    detach_code_dirs,
    drop_capabilities,
    enter_namespaces,
    mount_proc,
    set_limits,
)
from hypermedia.sandbox.host import _LAYERS, _LEN

_PR_SET_NAME: Final = 15
_libc_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _spare_main(request_fd: int, report_fd: int, procs_files: tuple[str, ...] | None) -> NoReturn:
    """Runs in a spare (:class:`_Spare`): joins its group, keeps nothing of the zygote's but its
    two pipes, waits for the request, then is the job's child (:func:`_child_main`, which skips
    the join when it worked, and tries it again to report the failure when it did not). Exits
    when the zygote closes the pipe without a request."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _set_name(b"hm-spare")  # what ps and the tests tell it by
    joined = True
    try:
        cgroups.join_job_cgroup(procs_files)
    except cgroups.CgroupJoinFailed:
        joined = False
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    # Only the two pipes stay open: a spare holding the zygote's stdout would keep the worker
    # from seeing the zygote's end.
    os.dup2(request_fd, 3)
    os.dup2(report_fd, 4)
    os.closerange(5, os.sysconf("SC_OPEN_MAX"))
    data = bytearray()
    while True:
        chunk = os.read(3, 1 << 16)
        if not chunk:
            break
        data += chunk
    if len(data) < _LEN.size:
        os._exit(0)
    (size,) = _LEN.unpack_from(data)
    request = pickle.loads(bytes(data[_LEN.size : _LEN.size + size]))
    _set_name(b"hm-job")
    if joined:
        request["cgroup"] = None
    _child_main(request, 4)


def _set_name(name: bytes) -> None:
    """``prctl(PR_SET_NAME)``: the process's ``comm`` (``/proc/<pid>/comm``, ps), at most 15 bytes."""
    _libc_prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _child_main(request: dict[str, Any], report_fd: int) -> NoReturn:
    """Runs in the forked child: confine, run the entry, write a JSON report, exit.

    Order (docs/adr/0041): root clones the code dirs as detached mounts and drops to the slot
    uid; then a user
    namespace owning new network, mount, IPC and PID namespaces (:func:`enter_namespaces`), the
    mount confinement (without root: in that user namespace), pid 1 of the PID namespace
    (:func:`_spawn_init`), then a fork: this process waits for the job and ends as it did
    (:func:`_wait_and_mirror`). The job mounts its own ``/proc``, sets the rlimits, drops every
    capability, sets ``no_new_privs``, applies Landlock (read everywhere, write in the job dir)
    and the seccomp filter (:mod:`hypermedia.sandbox.seccomp`), then runs the entry. The report
    carries the set-up's and the entry's times as spans (:mod:`hypermedia.sandbox.spans`)."""
    report: dict[str, Any]
    layers: dict[str, bool | None] = dict.fromkeys(_LAYERS)
    setup_started = time.time_ns()
    timed: list[dict[str, Any]] = []  # the report's spans (hypermedia.sandbox.spans)
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
        entry_started = time.time_ns()
        timed.append(spans.timed("sandbox.setup", setup_started, entry_started))
        try:
            outputs = function(operation, params, Path(input_path), Path(output_dir), **request["kwargs"])
        finally:
            timed.append(spans.timed(f"engine.{operation}", entry_started, time.time_ns()))
        report = {"ok": True, "outputs": [_output_dict(o) for o in outputs]}
    except DomainError as exc:
        report = {
            "ok": False,
            "error_code": exc.error_code,
            "message": exc.public_message,
            "retryable": exc.retryable,
        }
        if isinstance(exc, CpuTimeExceeded):
            report["limit"] = "cpu_time"
    except MemoryError:
        report = {
            "ok": False,
            "error_code": "RESOURCE_LIMIT",
            "message": "The job exceeded its memory limit.",
            "limit": "memory",
        }
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            report = {
                "ok": False,
                "error_code": "RESOURCE_LIMIT",
                "message": "The job exceeded its file size limit.",
                "limit": "file_size",
            }
        else:
            report = _internal_report()
    except BaseException:
        report = _internal_report()
    report.update(layers, spans=timed)
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
