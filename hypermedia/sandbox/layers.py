"""Which isolation layers this process can give its jobs, found at worker start by really trying
each one in a short-lived forked child, and the ``HM_SANDBOX_REQUIRE`` check that refuses to start
a worker whose required layers are missing (docs/adr/0043, docs/security.md "Layers").

A probe never changes this process: every namespace, filter and uid change happens in a child that
exits at once (cgroups: a directory made and removed again). Measured as root on the shared 2-core
development machine while other test suites ran (10 runs): :func:`probe_layers` median 119 ms (max
1.5 s), :func:`probe_layers_fresh` median 285 ms (max 0.97 s). They run once, in
:func:`hypermedia.worker.serve.serve_worker`, before the zygote starts.

Layers (:data:`LAYER_NAMES`):

==========  ==================================================================================
userns      ``unshare(CLONE_NEWUSER)`` and writing ``uid_map``/``gid_map`` (user_namespaces(7))
netns       ``unshare(CLONE_NEWNET)``; without root inside a new user namespace
mountns     ``unshare(CLONE_NEWNS)``, ``/`` made private and a tmpfs mounted (mount_namespaces(7)):
            a runtime's AppArmor profile may allow the unshare and refuse the mount
pidns       ``unshare(CLONE_NEWPID)`` and a fork that is pid 1 (pid_namespaces(7))
ipcns       ``unshare(CLONE_NEWIPC)`` (ipc_namespaces(7))
landlock    the ABI version (``landlock_create_ruleset(NULL, 0, VERSION)``) and a ruleset applied
seccomp     ``prctl(PR_GET_SECCOMP)`` answers and a one-instruction ALLOW filter loads after
            ``PR_SET_NO_NEW_PRIVS`` (seccomp(2), prctl(2))
cgroups     :func:`probe_cgroups`: a directory can be made under this process's own cgroup with
            memory and pids (v1: each controller's hierarchy; v2: both in its controllers)
uid_switch  root only: ``setgroups([])``, ``setgid``, ``setuid`` to a pool uid
==========  ==================================================================================
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hypermedia.sandbox import cgroupfind, landlock

__all__ = [
    "LAYER_NAMES",
    "REQUIRE_BEST_EFFORT",
    "REQUIRE_FULL",
    "Layer",
    "LayersMissing",
    "check_required",
    "parse_require",
    "probe_cgroups",
    "probe_layers",
    "probe_layers_fresh",
    "summary",
]

LAYER_NAMES: Final = (
    "userns",
    "netns",
    "mountns",
    "pidns",
    "ipcns",
    "landlock",
    "seccomp",
    "cgroups",
    "uid_switch",
)
"""Every layer :func:`probe_layers` reports, in this order."""

REQUIRE_FULL: Final = "full"
"""``HM_SANDBOX_REQUIRE=full``: every layer but ``uid_switch`` (which only root can have)."""
REQUIRE_BEST_EFFORT: Final = "best-effort"
"""``HM_SANDBOX_REQUIRE=best-effort``: start whatever holds, and say what holds."""

FULL_LAYERS: Final = tuple(name for name in LAYER_NAMES if name != "uid_switch")

PROBE_TIMEOUT_SECONDS: Final = 5.0
"""Longest one probe child may take before it is killed and its layer counted missing."""

# uapi/linux/sched.h
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
# uapi/linux/prctl.h, uapi/linux/seccomp.h, uapi/linux/filter.h, uapi/linux/mount.h
_PR_GET_SECCOMP, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 21, 22, 38
_SECCOMP_MODE_FILTER, _SECCOMP_RET_ALLOW = 2, 0x7FFF0000
_BPF_RET_K = 0x06
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 16384, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)

_SECCOMP_PROFILE: Final = "deploy/k8s/seccomp/hypermedia-worker.json"
_APPARMOR_PROFILE: Final = "deploy/k8s/apparmor/hypermedia-worker"


@dataclass(frozen=True)
class Layer:
    """One isolation layer as probed."""

    name: str
    """One of :data:`LAYER_NAMES`."""
    available: bool
    """True when the probe child applied it."""
    detail: str
    """When available: what was applied (ABI, path, "inside a user namespace"); otherwise why it
    is missing and how to grant it."""


class LayersMissing(Exception):
    """A layer that ``HM_SANDBOX_REQUIRE`` names is missing; the worker exits 78 (EX_CONFIG).
    ``str()`` is one line naming each missing layer and how to grant it."""

    exit_code = 78


class _Refused(Exception):
    """A probe step failed: ``step`` is the call, ``err`` its errno."""

    def __init__(self, step: str, err: int) -> None:
        super().__init__(f"{step}: {os.strerror(err)} ({errno.errorcode.get(err, err)})")
        self.step = step
        self.err = err


def _check(result: int, step: str) -> None:
    if result != 0:
        raise _Refused(step, ctypes.get_errno())


def _write(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise _Refused(f"open {path}", exc.errno or errno.EIO) from None
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        raise _Refused(f"write {path}", exc.errno or errno.EIO) from None
    finally:
        os.close(fd)


def _enter_userns() -> None:
    """``unshare(CLONE_NEWUSER)`` and map this process's uid and gid to 0 inside."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def _unshare(flag: int, name: str, *, as_root: bool) -> str:
    """Unshares ``flag``; without root inside a new user namespace first (one call, as
    bubblewrap does). Returns how."""
    if as_root:
        _check(_libc.unshare(flag), f"unshare({name})")
        return "as root"
    _enter_userns()
    _check(_libc.unshare(flag), f"unshare({name})")
    return "inside a user namespace"


def _in_child(attempt: Callable[[], str]) -> tuple[bool, str]:
    """Runs ``attempt`` in a forked child; returns (succeeded, its detail or the error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 0
        try:
            os.close(read_end)
            try:
                message = {"ok": True, "detail": attempt()}
            except _Refused as exc:
                message = {"ok": False, "detail": str(exc), "step": exc.step, "errno": exc.err}
            except BaseException as exc:
                message = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
            os.write(write_end, json.dumps(message).encode()[:4000])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        chunks: list[bytes] = []
        ready, _, _ = select.select([read_end], [], [], PROBE_TIMEOUT_SECONDS)
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False, f"the probe did not answer within {PROBE_TIMEOUT_SECONDS:.0f} s"
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    try:
        message = json.loads(b"".join(chunks))
    except ValueError:
        return False, f"the probe child ended without a report (wait status {status})"
    return bool(message["ok"]), str(message["detail"])


def _read_sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _userns_remedy() -> str:
    """How to grant unprivileged user namespaces, from what the kernel says about them."""
    reasons = []
    if _read_sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        reasons.append("kernel.unprivileged_userns_clone=0: set it to 1")
    if _read_sysctl("/proc/sys/user/max_user_namespaces") == "0":
        reasons.append("user.max_user_namespaces=0: set it to 15000 or more")
    if _read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        reasons.append(
            "kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 23.10+): confine the worker "
            f"with an AppArmor profile that has the 'userns,' rule ({_APPARMOR_PROFILE}) or set it to 0"
        )
    if not reasons:
        reasons.append(
            "refused by the container runtime's seccomp profile (RuntimeDefault and Docker's "
            f"default refuse unshare and clone with namespace flags): run with {_SECCOMP_PROFILE} "
            "(Kubernetes seccompProfile Localhost; Docker --security-opt seccomp=...)"
        )
    return "unprivileged user namespaces refused: " + "; ".join(reasons)


def _namespace_remedy(name: str, as_root: bool, detail: str) -> str:
    if as_root:
        return f"{detail}: the runtime's seccomp profile refuses it; run with {_SECCOMP_PROFILE}"
    return f"{detail}: needs a user namespace (see userns) or root"


def _probe_userns(as_root: bool) -> Layer:
    def attempt() -> str:
        _enter_userns()
        return "unshare(CLONE_NEWUSER) and uid_map written"

    ok, detail = _in_child(attempt)
    return Layer("userns", ok, detail if ok else f"{detail}; {_userns_remedy()}")


def _probe_netns(as_root: bool) -> Layer:
    ok, detail = _in_child(lambda: _unshare(_CLONE_NEWNET, "CLONE_NEWNET", as_root=as_root))
    return Layer("netns", ok, detail if ok else _namespace_remedy("netns", as_root, detail))


def _mount_attempt(as_root: bool) -> str:
    how = _unshare(_CLONE_NEWNS, "CLONE_NEWNS", as_root=as_root)
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount / private")
    _check(
        _libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"size=16k"),
        "mount tmpfs on /tmp",
    )
    return f"{how}; / private and a tmpfs mounted"


def _probe_mountns(as_root: bool) -> Layer:
    ok, detail = _in_child(lambda: _mount_attempt(as_root))
    if ok:
        return Layer("mountns", True, detail)
    if "mount" in detail.split(":", 1)[0] and "unshare" not in detail.split(":", 1)[0]:
        detail += (
            "; the unshare held but mount was refused: an AppArmor profile that denies mount "
            f"(docker-default, cri-containerd.apparmor.d): confine the worker with {_APPARMOR_PROFILE}"
        )
        return Layer("mountns", False, detail)
    return Layer("mountns", False, _namespace_remedy("mountns", as_root, detail))


def _pid_attempt(as_root: bool) -> str:
    how = _unshare(_CLONE_NEWPID, "CLONE_NEWPID", as_root=as_root)
    pid = os.fork()  # the first child after unshare(CLONE_NEWPID) is pid 1 of the new namespace
    if pid == 0:
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise _Refused("fork into the new pid namespace (not pid 1)", errno.EINVAL)
    return f"{how}; the first fork is pid 1"


def _probe_pidns(as_root: bool) -> Layer:
    ok, detail = _in_child(lambda: _pid_attempt(as_root))
    return Layer("pidns", ok, detail if ok else _namespace_remedy("pidns", as_root, detail))


def _probe_ipcns(as_root: bool) -> Layer:
    ok, detail = _in_child(lambda: _unshare(_CLONE_NEWIPC, "CLONE_NEWIPC", as_root=as_root))
    return Layer("ipcns", ok, detail if ok else _namespace_remedy("ipcns", as_root, detail))


def _landlock_attempt() -> str:
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    try:
        abi = landlock.restrict_self([landlock.Rule("/", landlock.READ_WRITE)])
    except OSError as exc:
        raise _Refused(f"landlock ({exc})", exc.errno or errno.EPERM) from None
    return f"ABI {abi}"


def _probe_landlock(as_root: bool) -> Layer:
    abi = landlock.abi_version()
    if abi == 0:
        return Layer(
            "landlock",
            False,
            "the kernel has no Landlock (landlock_create_ruleset: ENOSYS or EOPNOTSUPP): needs "
            "Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK and 'landlock' in the lsm= boot "
            "parameter",
        )
    ok, detail = _in_child(_landlock_attempt)
    if ok:
        return Layer("landlock", True, detail)
    return Layer(
        "landlock",
        False,
        f"ABI {abi} but a ruleset did not apply: {detail}; the runtime's seccomp profile may "
        f"refuse the landlock_* calls: run with {_SECCOMP_PROFILE}",
    )


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


def _seccomp_attempt() -> str:
    mode = _libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0)
    if mode < 0:
        raise _Refused("prctl(PR_GET_SECCOMP)", ctypes.get_errno())
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    allow = (_SockFilter * 1)(_SockFilter(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    prog = _SockFprog(1, allow)
    _check(
        _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
        "prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)",
    )
    before = "already filtered by the runtime" if mode == 2 else "no filter before"
    return f"a filter loads ({before})"


def _probe_seccomp(as_root: bool) -> Layer:
    ok, detail = _in_child(_seccomp_attempt)
    if ok:
        return Layer("seccomp", True, detail)
    return Layer(
        "seccomp",
        False,
        f"{detail}: needs a kernel with CONFIG_SECCOMP_FILTER (every distribution kernel has it) "
        "and prctl/seccomp allowed by the runtime's own profile",
    )


def _try_mkdir(parent: Path) -> None:
    probe = parent / f"hm-probe-{os.getpid()}"
    probe.mkdir()
    probe.rmdir()


def probe_cgroups(proc: Path = Path("/proc/self")) -> Layer:
    """Whether per-job cgroups with memory and pids limits can be made: this process's own
    groups found as :mod:`hypermedia.sandbox.cgroupfind` finds them (v2, or v1 memory and pids),
    the v2 group offering both controllers (``cgroup.controllers``), and a directory made (and
    removed again) in each (cgroups(7), Documentation/admin-guide/cgroup-v2.rst "Delegation").

    Returns:
        Layer ``cgroups``; its detail names the version and the path, or what was refused.
    """
    try:
        found = cgroupfind.discover((proc / "cgroup").read_text(), (proc / "mountinfo").read_text())
    except (OSError, cgroupfind.CgroupError) as exc:
        return Layer("cgroups", False, f"cannot read {proc}/cgroup or mountinfo: {exc}")
    problem = found.reason if isinstance(found, cgroupfind.Unavailable) else None
    if isinstance(found, cgroupfind.Discovery):
        dirs = [Path(d) for d in found.dirs.values()]
        try:
            if found.version == 2:
                controllers = (dirs[0] / "cgroup.controllers").read_text().split()
                if not {"memory", "pids"} <= set(controllers):
                    problem = (
                        f"v2 {dirs[0]} has no memory and pids controllers ({' '.join(controllers) or 'none'})"
                    )
            if problem is None:
                for directory in dirs:
                    _try_mkdir(directory)
                return Layer("cgroups", True, f"v{found.version} " + ", ".join(map(str, dirs)))
        except OSError as exc:
            problem = f"v{found.version} {exc.filename}: {exc.strerror}"
    return Layer(
        "cgroups",
        False,
        f"no delegated cgroup ({problem}): run the worker in a container with its "
        "own cgroup namespace on cgroup v2 (Kubernetes, Docker --cgroupns=private) with memory and "
        "pids enabled, or chown its cgroup directory to the worker's uid (systemd: Delegate=yes)",
    )


def _setuid_attempt(uid: int) -> str:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise _Refused(f"setuid({uid}) left uid {os.getuid()}", errno.EPERM)
    return f"setuid to pool uid {uid}"


def _probe_uid_switch(as_root: bool, pool_uid: int) -> Layer:
    if not as_root:
        return Layer(
            "uid_switch",
            False,
            f"the worker runs as uid {os.geteuid()}: a uid per slot needs root (CAP_SETUID, "
            "CAP_SETGID); the user namespace stands in for it",
        )
    ok, detail = _in_child(lambda: _setuid_attempt(pool_uid))
    return Layer("uid_switch", ok, detail)


def probe_layers(pool_uid: int) -> tuple[Layer, ...]:
    """Probes every layer of :data:`LAYER_NAMES`, in that order, each in a forked child (cgroups:
    a directory made and removed). ``pool_uid`` is the first sandbox uid (``HM_SANDBOX_UID_BASE``)
    the ``uid_switch`` probe switches to when this process is root. Never raises for a missing
    layer: that is ``available=False`` with the reason and the remedy in ``detail``."""
    as_root = os.geteuid() == 0
    return (
        _probe_userns(as_root),
        _probe_netns(as_root),
        _probe_mountns(as_root),
        _probe_pidns(as_root),
        _probe_ipcns(as_root),
        _probe_landlock(as_root),
        _probe_seccomp(as_root),
        probe_cgroups(),
        _probe_uid_switch(as_root, pool_uid),
    )


def parse_require(value: str) -> tuple[str, ...]:
    """The layers ``HM_SANDBOX_REQUIRE`` requires: ``full`` → :data:`FULL_LAYERS`,
    ``best-effort`` → none, else a comma list of :data:`LAYER_NAMES`.

    Raises:
        ValueError: an empty value or an unknown layer name (the message names the variable).
    """
    text = value.strip().lower()
    if text == REQUIRE_FULL:
        return FULL_LAYERS
    if text == REQUIRE_BEST_EFFORT:
        return ()
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in LAYER_NAMES]
    if not names or unknown:
        raise ValueError(
            "HM_SANDBOX_REQUIRE: 'full', 'best-effort' or a comma list of "
            + ", ".join(LAYER_NAMES)
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return names


def check_required(layers: Iterable[Layer], required: Iterable[str]) -> None:
    """Raises :class:`LayersMissing` (one line: each missing layer with how to grant it) when a
    layer in ``required`` is not available in ``layers``."""
    by_name: Mapping[str, Layer] = {layer.name: layer for layer in layers}
    missing = [by_name[n] for n in required if n in by_name and not by_name[n].available]
    if missing:
        raise LayersMissing(
            "sandbox layers required by HM_SANDBOX_REQUIRE are missing: "
            + " | ".join(f"{layer.name}: {layer.detail}" for layer in missing)
        )


def summary(layers: Iterable[Layer]) -> str:
    """One line for the log: ``userns=yes netns=yes … uid_switch=no``."""
    return " ".join(f"{layer.name}={'yes' if layer.available else 'no'}" for layer in layers)


def probe_layers_fresh(pool_uid: int) -> tuple[Layer, ...]:
    """:func:`probe_layers` in a fresh interpreter (``python -m hypermedia.sandbox.layers``), as the
    worker and ``hypermedia up`` call it. A process that has loaded gRPC must not be the one that
    forks the probes: gRPC's ``pthread_atfork`` handlers may start threads in the child, and
    ``unshare(CLONE_NEWUSER)`` refuses a multithreaded caller with ``EINVAL`` (unshare(2)), which
    failed about half the probes of a worker. The zygote is a fresh interpreter too, so this
    probes what it will have. Costs one interpreter start on top (285 ms median in all, measured
    as in the module docstring), once.

    Raises:
        RuntimeError: the probe process failed or printed no report (its stderr in the message).
    """
    result = subprocess.run(
        [sys.executable, "-m", "hypermedia.sandbox.layers", str(pool_uid)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _package_root()},
        check=False,
    )
    try:
        rows = json.loads(result.stdout)
        return tuple(Layer(str(r["name"]), bool(r["available"]), str(r["detail"])) for r in rows)
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(
            f"sandbox layer probe failed (exit {result.returncode}): {result.stderr.strip()[-500:]}"
        ) from None


def _package_root() -> str:
    """The directory that holds the ``hypermedia`` package this module was imported from."""
    return str(Path(__file__).resolve().parents[2])


def summary_line(require: str, uid_base: int) -> str:
    """The one line ``hypermedia up`` prints about the workers' isolation: the
    ``HM_SANDBOX_REQUIRE`` they run with and which layers hold for this process's uid (the
    workers' own), probed as a worker probes them (:func:`probe_layers_fresh`)."""
    found = probe_layers_fresh(uid_base)
    held = ", ".join(layer.name for layer in found if layer.available) or "none"
    missing = ", ".join(layer.name for layer in found if not layer.available) or "none"
    return f"hypermedia up: workers run with HM_SANDBOX_REQUIRE={require}; layers that hold: {held}; missing: {missing}"


if __name__ == "__main__":
    print(json.dumps([layer.__dict__ for layer in probe_layers(int(sys.argv[1]))]))
