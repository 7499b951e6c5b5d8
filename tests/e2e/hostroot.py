"""Run a command as if on another machine's disk: a filesystem root of its own, then exec.

Started by :func:`tests.e2e.hosts.Host.popen` as root in new mount and UTS namespaces (``unshare
--mount --uts --propagation private``) and, before that, in the host's network namespace
(``nsenter --net``)::

    python hostroot.py '{"root": ..., "hostname": ..., "read_only": [...], "files": {...}, "dirs": [...]}' -- ARGV...

The hostname is set first.

The new root is a tmpfs holding only: the read-only bind mounts named (the system's ``/usr`` and
``/etc``, the project's checkout and its Python), Debian's ``/bin``, ``/lib``, ``/lib64`` and
``/sbin`` links, ``/dev`` (with an empty ``/dev/shm``), a fresh ``/proc``, the host's ``/sys`` (the
cgroup hierarchies the worker makes its jobs' groups in), empty ``/tmp``, ``/var/tmp`` and ``/run``,
the ``files`` copied in (destination → source) and the ``dirs`` made. The old root is then
``pivot_root``-ed away and detached: nothing else of this machine's disk (the platform's state
directory, its object store, its hand-off socket) can be reached. ``pivot_root`` and not ``chroot``:
the kernel refuses a user namespace to a chrooted process, and the worker's sandbox makes one a job.

Standard library only: it runs before the project is importable from the new root's view.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
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
    for path in spec["read_only"]:  # type: ignore[attr-defined]
        target = _inside(root, path)
        target.mkdir(parents=True, exist_ok=True)
        _run("mount", "--rbind", path, str(target))
        _run("mount", "-o", "remount,bind,ro", str(target))
    for name in ("dev", "sys"):
        (root / name).mkdir(exist_ok=True)
        _run("mount", "--rbind", f"/{name}", str(root / name))
    _run("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "dev" / "shm"))
    (root / "proc").mkdir()
    _run("mount", "-t", "proc", "proc", str(root / "proc"))
    for name in ("tmp", "var/tmp", "run"):
        (root / name).mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / name))
    for dest, source in spec["files"].items():  # type: ignore[attr-defined]
        target = _inside(root, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o600)
    for path in spec["dirs"]:  # type: ignore[attr-defined]
        _inside(root, path).mkdir(parents=True, exist_ok=True)


def pivot(root: Path) -> None:
    """Make ``root`` this mount namespace's ``/`` and detach the old one."""
    os.chdir(root)
    os.mkdir(".oldroot")
    _run("pivot_root", ".", ".oldroot")
    os.chdir("/")
    _run("umount", "-l", "/.oldroot")
    os.rmdir("/.oldroot")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: hostroot.py SPEC_JSON -- ARGV...")
    spec = json.loads(argv[0])
    socket.sethostname(spec["hostname"])
    root = Path(spec["root"])
    build(root, spec)
    pivot(root)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
