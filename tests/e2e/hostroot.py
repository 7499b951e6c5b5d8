"""Run a command as if on another machine's disk: a filesystem root of its own, then exec.

Started by :func:`tests.e2e.hosts.Host.popen` as root in new mount and UTS namespaces (``unshare
--mount --uts --propagation private``), after joining the host's network namespace (``nsenter
--net``)::

    python hostroot.py '{"root": ..., "hostname": ..., "read_only": [...], "files": {...}, "dirs": [...]}' -- ARGV...

The hostname is set first. The command runs as pid 1 of a new PID namespace, forked from this
script, which waits for it and passes on SIGTERM, SIGINT and SIGHUP: its ``/proc`` shows only its
own processes, so no ``/proc/<pid>/root`` of this machine's leads back to its disk.

The new root is a tmpfs holding only: the read-only bind mounts named (the system's ``/usr`` and
``/etc``, the project's checkout and its Python), Debian's ``/bin``, ``/lib``, ``/lib64`` and
``/sbin`` links, ``/dev`` (with an empty ``/dev/shm``), a ``/proc`` of its own, the host's ``/sys`` (the
cgroup hierarchies the worker makes its jobs' groups in), empty ``/tmp``, ``/var/tmp`` and ``/run``,
the ``files`` copied in (destination → source) and the ``dirs`` made. The old root is then
``pivot_root``-ed away and detached: nothing else of this machine's disk (the platform's state
directory, its object store, its hand-off socket) can be reached. ``pivot_root`` and not ``chroot``:
the kernel refuses a user namespace to a chrooted process, and the worker's sandbox makes one a job.

Standard library only: it runs before the project is importable from the new root's view.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where ``mount``, ``pivot_root`` and ``umount`` are looked for, whatever ``PATH`` the command gets."""


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, env={"PATH": SYSTEM_PATH})


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def build(root: Path, spec: dict[str, object]) -> None:
    """Mount the new root at ``root`` as the module docstring says (before the pivot)."""
    root.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(root))
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            os.symlink(os.readlink(f"/{link}"), root / link)
    # The empty directories first: a read-only path may lie under one (a checkout in /tmp).
    for name in ("tmp", "var/tmp", "run"):
        (root / name).mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / name))
    for path in spec["read_only"]:  # type: ignore[attr-defined]
        target = _inside(root, path)
        target.mkdir(parents=True, exist_ok=True)
        _run("mount", "--rbind", path, str(target))
        # A remount is per mount: the bind's own, then each mount under it (util-linux 2.38 has
        # no ro=recursive).
        for mount_point in [str(target), *_mounts_under(target)]:
            _run("mount", "-o", "remount,bind,ro", mount_point)
    for name in ("dev", "sys"):
        (root / name).mkdir(exist_ok=True)
        _run("mount", "--rbind", f"/{name}", str(root / name))
    _run("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "dev" / "shm"))
    (root / "proc").mkdir()
    for dest, source in spec["files"].items():  # type: ignore[attr-defined]
        target = _inside(root, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o600)
    for path in spec["dirs"]:  # type: ignore[attr-defined]
        _inside(root, path).mkdir(parents=True, exist_ok=True)


def _mounts_under(target: Path) -> list[str]:
    """Mount points strictly under ``target``, from /proc/self/mountinfo (its 5th field, with
    spaces and the like escaped as octal)."""
    prefix = str(target).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            found.append(point)
    return found


def pivot(root: Path) -> None:
    """Make ``root`` this mount namespace's ``/`` and detach the old one."""
    os.chdir(root)
    os.mkdir(".oldroot")
    _run("pivot_root", ".", ".oldroot")
    os.chdir("/")
    _run("umount", "-l", "/.oldroot")
    os.rmdir("/.oldroot")


PR_SET_PDEATHSIG = 1
CLONE_NEWPID = 0x20000000


def _host_init(root: Path, argv: list[str]) -> None:
    """The forked child, pid 1 of the new PID namespace: dies with its parent, mounts a ``/proc``
    of that namespace (only its own processes), pivots, and becomes ``argv``."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _run("mount", "-t", "proc", "proc", str(root / "proc"))
    pivot(root)
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: hostroot.py SPEC_JSON -- ARGV...")
    spec = json.loads(argv[0])
    socket.sethostname(spec["hostname"])
    root = Path(spec["root"])
    build(root, spec)
    # unshare(CLONE_NEWPID) once the mounts are made (each `mount` above was a child, and the
    # first child in a new PID namespace is its init): this process stays outside, and the child
    # forked next is the namespace's pid 1. This process waits for it, passing on the signals a
    # supervisor sends, and exits as it did.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
    child = os.fork()
    if child == 0:
        try:
            _host_init(root, argv[2:])
        except BaseException:
            traceback.print_exc()
        os._exit(127)

    def pass_on(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
