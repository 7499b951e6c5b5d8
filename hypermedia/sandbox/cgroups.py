"""Per-job cgroups: a memory limit with swap 0, a pids limit and a group OOM kill for each job
child, on cgroup v2 or v1 behind one small interface (the shape runc uses: ``cgroups.Manager``
with an ``fs`` and an ``fs2`` implementation).

Shape::

    worker:  open_cgroups("auto") ─▶ Cgroups (base dirs made)  or  Unavailable(reason)
    zygote:  Cgroups.from_config(cfg).create(job_id, memory, pids) ─▶ JobCgroup  (before the fork)
    child:   join_job_cgroup(job.procs_files)                     (its very first step)
    zygote:  peak_bytes(), oom_killed(), kill_all(), remove()     (after the leader is reaped)

Only groups nested under the cgroup this process is in are made; no process is ever moved out
of its own tree. The kernel's interface is its documentation:
Documentation/admin-guide/cgroup-v2.rst (v2: ``memory.max``, ``memory.swap.max``,
``memory.oom.group``, ``memory.peak`` since 5.19, ``memory.events``, ``pids.max``,
``cgroup.kill`` since 5.14, the "no internal process" rule) and
Documentation/admin-guide/cgroup-v1/memory.rst, pids.rst (v1: ``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes``, ``memory.max_usage_in_bytes``, ``memory.oom_control`` with
``oom_kill`` since 4.13, OOM notification through ``cgroup.event_control``); /proc/self/cgroup
and /proc/self/mountinfo are described in cgroups(7) and proc(5).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from hypermedia.core.errors import DomainError
from hypermedia.sandbox.cgroupfind import (
    _HOW_TO_DELEGATE,
    CONTROLLERS,
    CgroupError,
    Unavailable,
    discover,
)

REMOVE_SECONDS = 0.2
"""How long :meth:`JobCgroup.remove` retries ``rmdir`` (EBUSY while killed tasks finish exiting)."""

KILL_ROUNDS = 100
"""How often :meth:`JobCgroup.kill_all` re-reads ``cgroup.procs`` and SIGKILLs what it lists
(a fork bomb adds members while it is being killed; ``pids.max`` bounds each round)."""


class CgroupJoinFailed(DomainError):
    """The job child could not join its cgroup: it does not run (fail closed), the job may be retried."""

    retryable: ClassVar[bool] = True
    default_code: ClassVar[str] = "SANDBOX_UNAVAILABLE"


class JobCgroup(Protocol):
    """One job's cgroup (one directory per v1 hierarchy, one on v2)."""

    procs_files: tuple[str, ...]
    """The ``cgroup.procs`` files the child writes its pid to (:func:`join_job_cgroup`)."""
    oom_fd: int | None
    """An eventfd that becomes readable on an OOM in the group (v1), or None (v2 kills the
    group itself: ``memory.oom.group``)."""

    def peak_bytes(self) -> int | None:
        """Peak memory charged to the group, bytes; None where the kernel does not say (v2 < 5.19)."""

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a task of the group."""

    def kill_all(self) -> int:
        """SIGKILLs every task of the group; returns how many were signalled."""

    def set_limits(self, memory_bytes: int, pids_max: int) -> None:
        """Sets the group's memory limit (no swap) and ``pids.max``, raising or lowering them (a
        group made ahead of its job gets the job's limits at hand-off). Raises CgroupError."""

    def remove(self) -> bool:
        """Removes the group's directories (retrying ``rmdir`` for :data:`REMOVE_SECONDS` while
        killed tasks exit); closes :attr:`oom_fd`. False when one is still busy: call again later."""


class Cgroups(Protocol):
    """The job groups of one sandbox: a base directory per hierarchy, job groups under it."""

    version: int
    base: dict[str, str]
    """Filesystem directory of the base group per controller (v1) or ``""`` (v2)."""

    def create(self, job_id: str, memory_bytes: int, pids_max: int) -> JobCgroup:
        """Makes ``<base>/job-<job_id>`` limited to ``memory_bytes`` (no swap), ``pids_max`` tasks,
        OOM killing the whole group. Raises CgroupError (the job must then not run)."""

    def config(self) -> dict[str, Any]:
        """JSON-able description that :func:`from_config` rebuilds (sent to the zygote)."""

    def close(self) -> None:
        """Removes the base groups made by :func:`open_cgroups` (when empty)."""

    def describe(self) -> str:
        """One line for logs and status: version, controllers and where."""


def _write(path: str, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {os.strerror(exc.errno or 0)}") from None


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """Value of ``key`` in a flat-keyed file (``memory.events``, ``memory.oom_control``)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _pids(procs_file: str) -> list[int]:
    return [int(p) for p in (_read(procs_file) or "").split()]


def _rmdir_all(dirs: Sequence[str]) -> bool:
    deadline = time.monotonic() + REMOVE_SECONDS
    pending = [d for d in dirs if os.path.isdir(d)]
    while pending:
        still = []
        for d in pending:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return False
                still.append(d)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
    return True


def _kill_listed(procs_files: Sequence[str]) -> int:
    signalled = 0
    for _ in range(KILL_ROUNDS):
        pids = {pid for f in procs_files for pid in _pids(f)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                signalled += 1
        time.sleep(0.001)
    return signalled


def _job_name(job_id: str) -> str:
    if not job_id or "/" in job_id or job_id in (".", ".."):
        raise CgroupError(f"invalid job id {job_id!r} for a cgroup name")
    return f"job-{job_id}"


# --- v1 ------------------------------------------------------------------------------------------


@dataclass
class V1JobCgroup:
    """A job's groups on the v1 ``memory`` and ``pids`` hierarchies."""

    memory_dir: str
    pids_dir: str
    procs_files: tuple[str, ...]
    oom_fd: int | None = None
    memory_bytes: int = 2**63 - 1
    """The memory limit last set (a new group's is unlimited, so the first :meth:`set_limits`
    lowers it)."""

    def peak_bytes(self) -> int | None:
        value = (_read(f"{self.memory_dir}/memory.max_usage_in_bytes") or "").strip()
        return int(value) if value.isdigit() else None

    def oom_killed(self) -> bool:
        control = _read(f"{self.memory_dir}/memory.oom_control")
        kills = _keyed(control, "oom_kill")
        if kills is not None:
            return kills > 0
        # Kernels before 4.13 have no oom_kill counter: an OOM leaves the group under_oom or
        # its failcnt raised with the usage at the limit.
        return bool(_keyed(control, "under_oom"))

    def kill_all(self) -> int:
        return _kill_listed(self.procs_files)

    def set_limits(self, memory_bytes: int, pids_max: int) -> None:
        # memory.memsw.limit_in_bytes may never be below memory.limit_in_bytes
        # (cgroup-v1/memory.rst 2.4): raise the pair memsw first, lower it memory first.
        memsw = f"{self.memory_dir}/memory.memsw.limit_in_bytes"
        files = [f"{self.memory_dir}/memory.limit_in_bytes"]
        if os.path.exists(memsw):  # swap accounting on
            files.append(memsw)
        if memory_bytes > self.memory_bytes:
            files.reverse()
        for path in files:
            _write(path, str(memory_bytes))
        self.memory_bytes = memory_bytes
        _write(f"{self.pids_dir}/pids.max", str(pids_max))

    def remove(self) -> bool:
        if self.oom_fd is not None:
            os.close(self.oom_fd)
            self.oom_fd = None
        return _rmdir_all((self.memory_dir, self.pids_dir))


@dataclass
class V1Cgroups:
    """Job groups on the v1 ``memory`` and ``pids`` hierarchies (no internal-process rule)."""

    base: dict[str, str]
    owned: bool = False
    """Whether :func:`open_cgroups` made the base groups (then :meth:`close` removes them)."""
    version: int = 1

    def create(self, job_id: str, memory_bytes: int, pids_max: int) -> V1JobCgroup:
        name = _job_name(job_id)
        memory_dir, pids_dir = f"{self.base['memory']}/{name}", f"{self.base['pids']}/{name}"
        job = V1JobCgroup(memory_dir, pids_dir, (f"{memory_dir}/cgroup.procs", f"{pids_dir}/cgroup.procs"))
        try:
            for d in (memory_dir, pids_dir):
                _mkdir_fresh(d)
            job.set_limits(memory_bytes, pids_max)
            job.oom_fd = _oom_eventfd(memory_dir)
        except CgroupError:
            job.remove()
            raise
        return job

    def config(self) -> dict[str, Any]:
        return {"version": 1, "base": self.base}

    def close(self) -> None:
        if self.owned:
            _rmdir_all(list(self.base.values()))

    def describe(self) -> str:
        return f"cgroup v1: memory at {self.base['memory']}, pids at {self.base['pids']}"


def _oom_eventfd(memory_dir: str) -> int:
    """An eventfd the kernel signals on an OOM in the group (cgroup-v1/memory.rst, "OOM
    Control": write ``"<event_fd> <fd of memory.oom_control>"`` to ``cgroup.event_control``)."""
    efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        control = os.open(f"{memory_dir}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(f"{memory_dir}/cgroup.event_control", f"{efd} {control}")
        finally:
            os.close(control)
    except (OSError, CgroupError) as exc:
        os.close(efd)
        raise CgroupError(f"cannot watch OOM events of {memory_dir}: {exc}") from None
    return efd


def _mkdir_fresh(path: str) -> None:
    """mkdir; a leftover empty group of an earlier attempt of the same job is removed first."""
    try:
        os.mkdir(path)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {os.strerror(exc.errno or 0)}") from None
    procs = f"{path}/cgroup.procs"
    _kill_listed([procs])
    if not _rmdir_all([path]):
        raise CgroupError(f"cgroup {path} exists and cannot be removed")
    try:
        os.mkdir(path)
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {os.strerror(exc.errno or 0)}") from None


# --- v2 ------------------------------------------------------------------------------------------


@dataclass
class V2JobCgroup:
    """A job's group on the unified hierarchy."""

    path: str
    procs_files: tuple[str, ...]
    oom_fd: int | None = None

    def peak_bytes(self) -> int | None:
        value = (_read(f"{self.path}/memory.peak") or "").strip()
        return int(value) if value.isdigit() else None

    def oom_killed(self) -> bool:
        return (_keyed(_read(f"{self.path}/memory.events"), "oom_kill") or 0) > 0

    def kill_all(self) -> int:
        count = len(_pids(self.procs_files[0]))
        if os.path.exists(f"{self.path}/cgroup.kill"):
            with contextlib.suppress(CgroupError):
                _write(f"{self.path}/cgroup.kill", "1")
                return count
        return _kill_listed(self.procs_files)

    def set_limits(self, memory_bytes: int, pids_max: int) -> None:
        _write(f"{self.path}/memory.max", str(memory_bytes))
        _write(f"{self.path}/pids.max", str(pids_max))

    def remove(self) -> bool:
        return _rmdir_all((self.path,))


@dataclass
class V2Cgroups:
    """Job groups on the unified hierarchy, under a parent whose ``cgroup.subtree_control``
    enables ``memory`` and ``pids`` (so the parent holds no process: the no-internal-process rule)."""

    base: dict[str, str]
    owned: bool = False
    version: int = 2

    def create(self, job_id: str, memory_bytes: int, pids_max: int) -> V2JobCgroup:
        path = f"{self.base['']}/{_job_name(job_id)}"
        job = V2JobCgroup(path, (f"{path}/cgroup.procs",))
        try:
            _mkdir_fresh(path)
            job.set_limits(memory_bytes, pids_max)
            if os.path.exists(f"{path}/memory.swap.max"):
                _write(f"{path}/memory.swap.max", "0")
            _write(f"{path}/memory.oom.group", "1")
        except CgroupError:
            job.remove()
            raise
        return job

    def config(self) -> dict[str, Any]:
        return {"version": 2, "base": self.base}

    def close(self) -> None:
        if self.owned:
            _rmdir_all(list(self.base.values()))

    def describe(self) -> str:
        return f"cgroup v2: memory and pids at {self.base['']}"


def _enable(parent: str) -> str | None:
    """Enables memory and pids for ``parent``'s children; a reason when they stay off."""
    controllers = (_read(f"{parent}/cgroup.controllers") or "").split()
    missing = [c for c in CONTROLLERS if c not in controllers]
    if missing:
        return f"{' and '.join(missing)} controller not enabled in {parent}/cgroup.controllers; {_HOW_TO_DELEGATE}"
    enabled = (_read(f"{parent}/cgroup.subtree_control") or "").split()
    if all(c in enabled for c in CONTROLLERS):
        return None
    try:
        _write(f"{parent}/cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    except CgroupError as exc:
        return f"{exc}; {_HOW_TO_DELEGATE}"
    return None


def _open_v2(own: str, requested: str | None) -> V2Cgroups | Unavailable:
    """The v2 base: ``<requested>`` when given; else ``<root>/jobs`` where ``root`` is the own
    group, or its parent when this process already sits in ``<root>/worker``. A root that still
    holds processes gets them moved into ``<root>/worker`` first (all nested in the own tree)."""
    if requested is not None:
        with contextlib.suppress(FileExistsError, OSError):
            os.mkdir(requested)
        reason = _enable(requested)
        return Unavailable(reason) if reason else V2Cgroups({"": requested})
    parent = os.path.dirname(own)
    if os.path.basename(own) == "worker" and not _enable(parent) and os.path.isdir(f"{parent}/jobs"):
        root = parent
    else:
        root = own
        controllers = (_read(f"{root}/cgroup.controllers") or "").split()
        missing = [c for c in CONTROLLERS if c not in controllers]
        if missing:
            return Unavailable(
                f"{' and '.join(missing)} controller not enabled in {root}/cgroup.controllers; {_HOW_TO_DELEGATE}"
            )
        try:
            os.makedirs(f"{root}/worker", exist_ok=True)
            for pid in _pids(f"{root}/cgroup.procs"):
                with contextlib.suppress(CgroupError):  # a process that exited meanwhile
                    _write(f"{root}/worker/cgroup.procs", str(pid))
        except (OSError, CgroupError) as exc:
            return Unavailable(
                f"cannot move this process into the leaf {root}/worker: {exc}; {_HOW_TO_DELEGATE}"
            )
    reason = _enable(root)
    if reason:
        return Unavailable(reason)
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(f"{root}/jobs")
    reason = _enable(f"{root}/jobs")
    return Unavailable(reason) if reason else V2Cgroups({"": f"{root}/jobs"})


# --- entry points --------------------------------------------------------------------------------


def setting_problem(setting: str) -> str | None:
    """What is wrong with a cgroup setting (``HM_SANDBOX_CGROUP``, ``HM_UNIT_CGROUP``): None for
    ``auto``, ``off`` or an absolute cgroup path without ``.`` or ``..`` components (a path is
    compared with the own group's as written, so ``/own/../other`` must not pass for nested)."""
    if setting in ("auto", "off"):
        return None
    if not setting.startswith("/"):
        return "must be auto, off or a cgroup path starting with /"
    if any(part in (".", "..") for part in setting.split("/")):
        return "a cgroup path must not have . or .. components"
    return None


def open_cgroups(
    setting: str,
    *,
    variable: str = "HM_SANDBOX_CGROUP",
    proc_cgroup: str | None = None,
    mountinfo: str | None = None,
) -> Cgroups | Unavailable:
    """The job groups of a sandbox, per ``HM_SANDBOX_CGROUP``:

    * ``off``: :class:`Unavailable` (RLIMIT_AS only).
    * ``auto``: under this process's own group: v1 ``<own>/hm-<pid>-<n>`` on each hierarchy (made
      here, removed by :meth:`Cgroups.close`); v2 ``<own>/jobs`` with this process moved into
      ``<own>/worker`` (see :func:`_open_v2`).
    * a cgroup path (``/…``, as /proc/self/cgroup spells it): that group, which must be the own
      group or nested under it, made when missing.

    ``proc_cgroup``/``mountinfo`` default to this process's files. Returns :class:`Unavailable`
    with the reason and how to grant it when nothing usable is delegated; never raises for that.
    ``variable`` names the setting in messages. Raises ValueError for a setting
    :func:`setting_problem` refuses."""
    if setting == "off":
        return Unavailable(f"{variable}=off")
    if (problem := setting_problem(setting)) is not None:
        raise ValueError(f"{variable}: {problem}, not {setting!r}")
    try:
        found = discover(
            proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text(),
            mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text(),
        )
    except (OSError, CgroupError) as exc:
        return Unavailable(f"cannot read this process's cgroups: {exc}")
    if isinstance(found, Unavailable):
        return found
    requested = None if setting == "auto" else setting.rstrip("/") or "/"
    if requested is not None:
        for key, path in found.paths.items():
            if requested != path and not requested.startswith(path.rstrip("/") + "/"):
                return Unavailable(
                    f"{variable}={setting} is not nested under this process's cgroup {path}"
                    f"{f' ({key})' if key else ''}; job groups are made only inside the own tree"
                )
    if found.version == 2:
        own = found.dirs[""]
        return _open_v2(
            own, None if requested is None else own + requested[len(found.paths[""].rstrip("/")) :]
        )
    base = {}
    sequence = next(_SANDBOXES)
    for controller in CONTROLLERS:
        own, path = found.dirs[controller], found.paths[controller]
        if requested is None:
            remove_stale_bases(own)
            base[controller] = f"{own.rstrip('/')}/hm-{os.getpid()}-{sequence}"
        else:
            base[controller] = own.rstrip("/") + requested[len(path.rstrip("/")) :]
    try:
        for d in base.values():
            os.makedirs(d, exist_ok=True)
            if not os.access(f"{d}/cgroup.procs", os.W_OK):
                raise PermissionError(errno.EACCES, "cgroup.procs not writable")
    except OSError as exc:
        return Unavailable(
            f"cannot create a job group under {d}: {os.strerror(exc.errno or 0)}; {_HOW_TO_DELEGATE}"
        )
    return V1Cgroups(base, owned=requested is None)


_SANDBOXES = itertools.count(1)
"""Numbers the v1 bases of one process's sandboxes (``hm-<pid>-<n>``): each sandbox's groups,
its spare's among them, stay its own (tests run several sandboxes in one process)."""


def remove_stale_bases(own: str) -> list[str]:
    """Removes the v1 base groups ``<own>/hm-<pid>-<n>`` of workers that are gone (no ``/proc/<pid>``:
    killed before :meth:`Cgroups.close`), killing what is left in their job groups first. Returns
    the directories removed. A base whose pid was reused is left alone (harmless, empty)."""
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(own) if e.is_dir() and e.name.startswith("hm-")]
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[3:].split("-", 1)[0]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        if remove_tree(entry.path):
            removed.append(entry.path)
    return removed


def remove_tree(path: str) -> bool:
    """Kill every process in the group ``path`` and the groups nested in it (a worker unit's
    execution holds its sandbox's base, which holds the job groups), then remove them, the deepest
    first (v1 refuses to remove a group that has children: EBUSY). True when all are gone."""
    dirs = [root for root, _subdirs, _files in os.walk(path, topdown=False)]
    _kill_listed([f"{d}/cgroup.procs" for d in dirs])
    return _rmdir_all(dirs)


def from_config(config: dict[str, Any]) -> Cgroups:
    """Rebuilds :meth:`Cgroups.config` (in the zygote); the base groups exist already."""
    base = {str(k): str(v) for k, v in config["base"].items()}
    return V1Cgroups(base) if config["version"] == 1 else V2Cgroups(base)


def join_job_cgroup(procs_files: Sequence[str] | None) -> None:
    """Moves the calling process into its job's groups (writes its pid to each ``cgroup.procs``);
    nothing for None (no cgroups). Call first in the child, before any namespace or uid change
    makes the files unwritable. Raises CgroupJoinFailed (the job must not run unlimited)."""
    for procs in procs_files or ():
        try:
            fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(
                    fd, b"0"
                )  # 0: the writing task's own thread group (cgroup-v1/cgroups.rst, cgroup-v2.rst)
            finally:
                os.close(fd)
        except OSError:
            raise CgroupJoinFailed("The job's sandbox could not be started; it will be retried.") from None


@dataclass
class PendingRemovals:
    """Job groups whose ``rmdir`` stayed busy: retried on each later reap and before exit."""

    groups: list[JobCgroup] = field(default_factory=list)

    def retry(self) -> None:
        self.groups = [g for g in self.groups if not (g.kill_all() >= 0 and g.remove())]


def platform_setting(*, proc_cgroup: str | None = None, mountinfo: str | None = None) -> tuple[str, str]:
    """What ``hypermedia up`` gives its workers as ``HM_SANDBOX_CGROUP`` and the one log line
    saying why, decided without changing any cgroup. v1 (this machine): ``auto`` (each worker
    makes ``hm-<pid>-<n>`` under its own groups). v2: ``auto`` only when this process is alone in its
    group (e.g. started by ``systemd-run --scope -p Delegate=yes``), since the first worker moves
    every process of that group into ``<own>/worker``; never the processes of a login session.
    Else ``off`` with the reason (jobs keep RLIMIT_AS)."""
    try:
        found = discover(
            proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text(),
            mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text(),
        )
    except (OSError, CgroupError) as exc:
        found = Unavailable(f"cannot read this process's cgroups: {exc}")
    if isinstance(found, Unavailable):
        return "off", f"per-job cgroups off (jobs keep RLIMIT_AS): {found.reason}"
    if found.version == 1:
        where = ", ".join(f"{found.dirs[c]}/hm-<pid>-<n>" for c in CONTROLLERS)
        return "auto", f"per-job cgroups: cgroup v1 memory and pids, each worker's jobs under {where}"
    own = found.dirs[""]
    others = [p for p in _pids(f"{own}/cgroup.procs") if p != os.getpid()]
    if others:
        return "off", (
            f"per-job cgroups off (jobs keep RLIMIT_AS): {own} holds {len(others)} other processes, which "
            "`hypermedia up` will not move (cgroup v2 allows no processes beside child groups); run it "
            "under `systemd-run --scope -p Delegate=yes` or set HM_SANDBOX_CGROUP to a delegated group"
        )
    return "auto", f"per-job cgroups: cgroup v2, workers in {own}/worker, jobs under {own}/jobs"
