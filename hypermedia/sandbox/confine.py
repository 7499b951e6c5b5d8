"""Confinement of a sandboxed process by the kernel: namespaces (network, mount: the shared writable
directories hidden, the code bind-mounted read-only), rlimits, the drop to the sandbox uid with
``no_new_privs``, and the ``/proc`` reads that count and kill a uid's processes. Used by the job
child (:mod:`hypermedia.sandbox.zygote`) and by confined helpers (:mod:`hypermedia.sandbox.helper`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pwd
import resource
import signal
import stat
import sys
from pathlib import Path
from typing import Final

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


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: this process's ``/proc/<pid>`` files become root's and it
    cannot be ptraced, so a job running under the same uid (a worker without root) cannot read its
    environment (``HM_DATABASE_URL``) or memory. See prctl(2), proc(5)."""
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
    here = Path(__file__).resolve().parents[2]  # hypermedia/sandbox/confine.py → the checkout
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
