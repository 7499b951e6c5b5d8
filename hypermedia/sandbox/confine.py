"""Confinement of a sandboxed process by the kernel: namespaces (a user namespace owning network,
mount, IPC and PID namespaces, :func:`enter_namespaces`; in the mount namespace the shared
writable directories hidden and the code bind-mounted read-only; a fresh ``/proc``), rlimits, the
drop to the sandbox uid with ``no_new_privs``, the capability drop, and the ``/proc`` reads that
count and kill a uid's processes. Used by the job child (:mod:`hypermedia.sandbox.zygote`) and by
confined helpers (:mod:`hypermedia.sandbox.helper`)."""

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

_CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID = 0x08000000, 0x10000000, 0x20000000

_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4

_LINUX_CAPABILITY_VERSION_3 = 0x20080522  # uapi/linux/capability.h

# uapi/linux/mount.h
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8

_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18

_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24

_ST_TO_MS = ((os.ST_RDONLY, _MS_RDONLY), (os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV),
             (os.ST_NOEXEC, _MS_NOEXEC), (os.ST_NOATIME, _MS_NOATIME),
             (os.ST_NODIRATIME, _MS_NODIRATIME), (os.ST_RELATIME, _MS_RELATIME))  # fmt: skip

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


def _confine_files(
    job_dir: str,
    private_tmp: str | None = None,
    *,
    new_namespace: bool = True,
    hide: tuple[str, ...] = (),
    trees: dict[str, int] | None = None,
) -> bool:
    """In a new mount namespace, cover each of :func:`_covered_dirs` with an empty,
    read-only, nosuid/nodev/noexec tmpfs; what lies under one of them is bound back at its path:
    the :func:`_code_dirs` read-only (nosuid/nodev), then the job dir writable. With
    ``private_tmp`` (a directory the confined uid owns), ``/tmp`` is that directory instead,
    bind-mounted writable (nosuid/nodev/noexec): for programs that insist on ``/tmp``, such as
    LibreOffice's named pipe. ``hide``: more directories covered the same way (a job's parent
    ``jobs/``: other jobs' directories are not there). ``new_namespace=False``: the caller made
    the mount namespace already (in its own user namespace, see :func:`enter_namespaces`).
    ``trees``: the code dirs as detached mounts (:func:`detach_code_dirs`), moved into place
    instead of bound (their fds are closed here). Needs CAP_SYS_ADMIN over the mount namespace
    (root, or a user namespace); False when the namespace or a mount is refused. Mount flags:
    mount(2), mount_namespaces(7)."""
    if new_namespace and _libc.unshare(_CLONE_NEWNS) != 0:
        return False
    fds: list[int] = []
    try:
        keep = []
        for code_dir in _code_dirs():
            if trees is not None and code_dir in trees:
                fds.append(trees.pop(code_dir))
                keep.append((code_dir, fds[-1], False, True))
            else:
                fds.append(os.open(code_dir, os.O_PATH | os.O_DIRECTORY))
                keep.append((code_dir, fds[-1], False, False))
        fds.append(os.open(job_dir, os.O_PATH | os.O_DIRECTORY))
        keep.append((job_dir, fds[-1], True, False))
        tmp_fd = None
        if private_tmp is not None:
            tmp_fd = os.open(private_tmp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            fds.append(tmp_fd)
        _cover_shared_dirs(keep, tmp_fd, hide)
        return True
    except OSError:
        return False  # mount refused (a restricted container): the documented fallback
    finally:
        for fd in [*fds, *(trees or {}).values()]:
            os.close(fd)


_OPEN_TREE, _MOVE_MOUNT = 428, 429  # the same on x86_64 and aarch64 (uapi asm-generic/unistd.h)
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 1, 0o2000000, 4, -100
_libc.syscall.restype = ctypes.c_long


def detach_code_dirs() -> dict[str, int] | None:
    """Each of :func:`_code_dirs` cloned as a detached mount (``open_tree(OPEN_TREE_CLONE)``,
    Linux 5.2): made by root before it drops to a slot uid that may not search the way there
    (``/root``), then moved into the job's user-namespace-owned mount namespace by
    :func:`_confine_files`. ``{path: fd}``, or None when the kernel refuses (the caller then
    makes the mount namespace as root). open_tree(2), move_mount(2)."""
    trees: dict[str, int] = {}
    for code_dir in _code_dirs():
        fd = _libc.syscall(_OPEN_TREE, _AT_FDCWD, code_dir.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
        if fd < 0:
            for opened in trees.values():
                os.close(opened)
            return None
        trees[code_dir] = int(fd)
    return trees


def _move_mount(fd: int, target: str) -> None:
    if _libc.syscall(_MOVE_MOUNT, fd, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"move_mount {target}: {os.strerror(err)}")


def _locked_flags(path: str) -> int:
    """The ``MS_*`` flags of the mount ``path`` is on (statvfs(3) ``f_flag``), with
    ``MS_STRICTATIME`` when it has no atime flag: in a user namespace an inherited mount's
    read-only, nosuid, nodev, noexec and atime flags are locked, and a bind remount must repeat
    them (``EPERM`` otherwise; mount_namespaces(7) "restrictions on mount namespaces")."""
    flags = os.statvfs(path).f_flag
    ms = 0
    for st, m in _ST_TO_MS:
        if flags & st:
            ms |= m
    if not ms & (_MS_NOATIME | _MS_RELATIME):
        ms |= _MS_STRICTATIME
    return ms


def _cover_shared_dirs(
    keep: list[tuple[str, int, bool, bool]], tmp_fd: int | None, hide: tuple[str, ...] = ()
) -> None:
    """``keep``: ``(path, fd, writable, detached)`` put back, in order, when under a covered dir:
    an ``O_PATH`` fd is bound, a detached mount (``detached``) moved."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing leaks back to the host
    hardening = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    covered = _covered_dirs()
    extra = tuple(d for d in hide if not any(d == c or d.startswith(c.rstrip("/") + "/") for c in covered))
    for shared in covered + extra:
        if os.path.islink(shared) or not os.path.isdir(shared):
            continue
        private = shared == "/tmp" and tmp_fd is not None
        if private:
            _mount(f"/proc/self/fd/{tmp_fd}", shared, None, _MS_BIND)
        else:
            _mount("tmpfs", shared, "tmpfs", hardening, "size=16k,mode=0755")
        for path, fd, writable, detached in keep:
            inside = os.path.relpath(path, shared)
            if inside.startswith(".."):
                continue
            target = os.path.join(shared, inside)
            os.makedirs(target, mode=0o755, exist_ok=True)
            if detached:
                _move_mount(fd, target)
            else:
                _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND)
            if not writable:  # code: read-only, but its extension modules must stay mappable
                flags = _locked_flags(target) | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                _mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags)
        if private:
            _mount(None, shared, None, _MS_REMOUNT | _MS_BIND | _locked_flags(shared) | hardening)
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


def enter_namespaces(*, network: bool) -> bool:
    """``unshare`` a new user namespace with, owned by it, new mount, IPC and PID namespaces (and
    network, when ``network``), then map this process's uid and gid to themselves inside
    (``setgroups`` denied first: an unprivileged process may map only its own ids). No root
    needed. The PID namespace is for the children: the caller forks once and its child is pid 1.
    False (nothing changed) when the kernel refuses the user namespace (``user.max_user_namespaces``
    0, an LSM or seccomp policy of a container). The process becomes dumpable for the moment it
    writes its maps (``/proc/self/*_map`` of an undumpable process are root's) and undumpable
    again after. See user_namespaces(7), unshare(2), pid_namespaces(7)."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWPID | (_CLONE_NEWNET if network else 0)
    if _libc.unshare(flags) != 0:
        return False
    _prctl(_PR_SET_DUMPABLE, 1)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    _prctl(_PR_SET_DUMPABLE, 0)
    return True


def mount_proc() -> bool:
    """Mounts a fresh ``proc`` (nosuid, nodev, noexec) on ``/proc``: call as pid 1 of a new PID
    namespace, in a mount namespace of the same user namespace; the process then sees its own
    namespace's processes only. False when refused (``EPERM``: the host's ``/proc`` has parts
    masked, as in a container, and the kernel will not mount an unmasked one; proc(5),
    mount_namespaces(7))."""
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except OSError:
        return False
    return True


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """Empties the bounding set (``PR_CAPBSET_DROP`` for 0..``/proc/sys/kernel/cap_last_cap``;
    skipped without CAP_SETPCAP), the ambient set, then the effective, permitted and inheritable
    sets (``capset``, ``_LINUX_CAPABILITY_VERSION_3``: two 32-bit words). Irreversible for the
    process and what it executes. Raises OSError when ``capset`` fails. capabilities(7),
    capset(2)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        last = 40  # CAP_CHECKPOINT_RESTORE, the last one of Linux 5.9 to 6.x
    for cap in range(last + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EPERM: no CAP_SETPCAP (then nothing can be gained through it either)
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def set_limits(memory_bytes: int, fsize_bytes: int, nproc: int) -> None:
    """``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (absolute: in a user namespace of its own
    the kernel counts the uid's tasks per user namespace, so the job's alone, and checks every
    ancestor namespace's count too: ``kernel/ucount.c``) and no core dumps. setrlimit(2)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
