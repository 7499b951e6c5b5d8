"""Where this process's cgroups are: ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` parsed
(cgroups(7), proc(5)), v2 or v1 told apart, cgroup namespaces and mounts of a sub-tree resolved.
Used by :mod:`hypermedia.sandbox.cgroups`."""

from __future__ import annotations

from dataclasses import dataclass

CONTROLLERS = ("memory", "pids")
"""The controllers a job group needs."""

_HOW_TO_DELEGATE = (
    "run the container with a private cgroup namespace and a writable cgroup "
    "(docker run --cgroupns=private; Kubernetes on cgroup v2 does this), or give the worker's "
    "systemd unit Delegate=yes, or set HM_SANDBOX_CGROUP=off to keep RLIMIT_AS only"
)


class CgroupError(Exception):
    """A cgroup could not be made, limited or removed; the message names the file and errno."""


@dataclass(frozen=True)
class Mount:
    """One cgroup line of /proc/self/mountinfo (proc(5)): ``root`` is the path, inside the
    hierarchy, that is mounted at ``mount_point``; ``fstype`` is ``cgroup`` or ``cgroup2``;
    ``options`` the super options (a v1 mount's controllers, e.g. ``("rw", "memory")``)."""

    root: str
    mount_point: str
    fstype: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class Unavailable:
    """No usable cgroup subtree: ``reason`` says what is missing and how to grant it."""

    reason: str


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` (cgroups(7): ``hierarchy-ID:controller-list:path``) as
    ``{controller: path}``; the v2 line (``0::/path``) is under the key ``""``, a named v1
    hierarchy under ``name=…``. Paths are relative to the reader's cgroup namespace root.
    Raises CgroupError for a line that is not of that form."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            raise CgroupError(f"unexpected /proc/self/cgroup line {line!r}")
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def parse_mountinfo(text: str) -> list[Mount]:
    """The ``cgroup`` and ``cgroup2`` mounts of ``/proc/<pid>/mountinfo`` (proc(5): ``id parent
    major:minor root mount-point options [optional…] - fstype source super-options``), in
    order. Octal escapes (``\\040``) in paths are decoded."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], tuple(tail[2].split(","))))
    return mounts


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _resolve(mount: Mount, path: str) -> str | None:
    """Filesystem directory of cgroup ``path`` through ``mount``, or None when the mount does not
    show it (its root is not ``path`` or an ancestor, e.g. a host mount seen from a cgroup namespace)."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return (mount.mount_point.rstrip("/") + path[len(root) :].rstrip("/")) or "/"


@dataclass(frozen=True)
class Discovery:
    """Where this process's cgroups are: ``version`` 1 or 2; ``dirs`` maps each of
    :data:`CONTROLLERS` (v1) or ``""`` (v2) to the filesystem directory of the process's own group;
    ``paths`` the same as cgroup paths."""

    version: int
    dirs: dict[str, str]
    paths: dict[str, str]


def discover(proc_cgroup: str, mountinfo: str) -> Discovery | Unavailable:
    """Decides which cgroup version holds :data:`CONTROLLERS` for the process whose
    ``/proc/<pid>/cgroup`` and ``mountinfo`` texts are given, and where its own groups are.
    v1 wins when it holds both controllers (a hybrid host such as this one: memory and pids on v1,
    an empty v2); v2 when no v1 hierarchy holds either and the v2 mount's root shows the group.
    Raises CgroupError for malformed text."""
    own = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    on_v1 = [c for c in CONTROLLERS if c in own]
    if on_v1 and len(on_v1) != len(CONTROLLERS):
        missing = [c for c in CONTROLLERS if c not in own]
        return Unavailable(
            f"controllers {on_v1} are on cgroup v1 but {missing} are not; mixed hierarchies are not supported"
        )
    if on_v1:
        dirs: dict[str, str] = {}
        for controller in CONTROLLERS:
            for mount in mounts:
                if mount.fstype == "cgroup" and controller in mount.options:
                    where = _resolve(mount, own[controller])
                    if where is not None:
                        dirs[controller] = where
                        break
            else:
                return Unavailable(
                    f"no cgroup v1 mount shows this process's {controller} group {own[controller]}; {_HOW_TO_DELEGATE}"
                )
        return Discovery(1, dirs, {c: own[c] for c in CONTROLLERS})
    if "" not in own:
        return Unavailable(
            f"this process is in no cgroup v2 group and no v1 memory group; {_HOW_TO_DELEGATE}"
        )
    for mount in mounts:
        if mount.fstype == "cgroup2":
            where = _resolve(mount, own[""])
            if where is not None:
                return Discovery(2, {"": where}, {"": own[""]})
    return Unavailable(f"no cgroup2 mount shows this process's group {own['']}; {_HOW_TO_DELEGATE}")
