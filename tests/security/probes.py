"""Sandbox entries that attack their own sandbox (run by tests/security/test_sandbox_probes.py).

Each reports what it managed to do as the metadata of one output file."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import resource
import socket
import time
from pathlib import Path

from hypermedia.engines.contract import OutputFile


def _report(out_dir: Path, facts: dict) -> list[OutputFile]:
    (out_dir / "report.txt").write_text("ok")
    return [OutputFile("report", "report.txt", "text/plain", facts)]


def fork_bomb(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Fork until refused (at most ``params["tries"]``, default 200); the children sleep (the
    sandbox must kill them with the job)."""
    started, refused = 0, None
    for _ in range(int(params.get("tries", 200))):
        try:
            pid = os.fork()
        except OSError as exc:
            refused = errno.errorcode.get(exc.errno, str(exc.errno))
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
    return _report(out_dir, {"started": started, "refused": refused})


def connect(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Try a TCP connection to ``params["port"]`` on loopback and to a public address."""
    results = {}
    for host, port in (("127.0.0.1", params["port"]), ("1.1.1.1", 80)):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect((host, port))  # a numeric address: no resolver involved
                results[host] = "connected"
        except OSError as exc:
            results[host] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return _report(out_dir, results)


def write_outside(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Try to create a file in each of ``params["paths"]``; returns path → outcome."""
    outcome = {}
    for directory in params["paths"]:
        target = os.path.join(directory, "hm-probe-escape")
        try:
            with open(target, "x") as fh:
                fh.write("escaped")
            outcome[directory] = "written"
        except OSError as exc:
            outcome[directory] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    own = Path.cwd() / "inside.txt"
    own.write_text("fine")
    outcome["job_dir"] = "written" if own.read_text() == "fine" else "failed"
    return _report(out_dir, outcome)


def limits(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """The rlimits the job runs under."""
    names = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_CORE")
    facts = {name: list(resource.getrlimit(getattr(resource, name))) for name in names}
    with contextlib.suppress(OSError):
        facts["dumpable"] = Path("/proc/self/status").read_text().count("NoNewPrivs:\t1")
    return _report(out_dir, facts)


def swap_output_dir(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Replace ``output/`` with a symlink to ``params["target"]`` and claim its ``params["name"]``
    as an output (the worker reading outputs has more rights than the job)."""
    out_dir.rename(out_dir.with_name("output.old"))
    out_dir.symlink_to(params["target"], target_is_directory=True)
    return [OutputFile("stolen", params["name"], "text/plain", {})]


def hard_linked_output(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """An output with a second name (a hard link): refused, whatever it points at."""
    (out_dir / "a.txt").write_text("mine")
    os.link(out_dir / "a.txt", Path.cwd() / "b.txt")
    return [OutputFile("linked", "a.txt", "text/plain", {})]


def escape_session(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Double-fork a grandchild into its own session (out of the job's process group) and sleep."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    return _report(out_dir, {"escaped": True})


def late_imports(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Imports ``params["modules"]`` (which the zygote did not preload) and lists
    ``params["paths"]``: what a job can load lazily, and what it sees of the directories around."""
    import importlib

    facts: dict = {}
    for name in params["modules"]:
        try:
            importlib.import_module(name)
            facts[name] = "imported"
        except ImportError as exc:
            facts[name] = type(exc).__name__
    for path in params["paths"]:
        try:
            facts[path] = sorted(os.listdir(path))
        except OSError as exc:
            facts[path] = errno.errorcode.get(exc.errno or 0, "OSError")
    return _report(out_dir, facts)


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib


def ptrace_attach(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """``ptrace(PTRACE_ATTACH, params["pid"])``: the seccomp filter kills the job (SIGSYS) first."""
    result = _libc().ptrace(16, params["pid"], None, None)  # PTRACE_ATTACH, uapi/linux/ptrace.h
    return _report(out_dir, {"ptrace": result, "errno": ctypes.get_errno()})


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vm_read(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """``process_vm_readv`` of 64 bytes at ``params["address"]`` of ``params["pid"]``."""
    buf = ctypes.create_string_buffer(64)
    local, remote = _IoVec(ctypes.addressof(buf), 64), _IoVec(params["address"], 64)
    number = {"x86_64": 310, "aarch64": 270}[platform.machine()]
    result = _libc().syscall(number, params["pid"], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return _report(out_dir, {"read": result, "errno": ctypes.get_errno()})


def refused_calls(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """What the seccomp filter and the namespaces refuse without killing: a tmpfs mount, a user
    namespace, an AF_INET socket (an AF_UNIX one is allowed), and what ``/proc`` shows: the
    processes there and the environment of ``params["zygote"]`` (the zygote's pid outside)."""
    lib = _libc()
    facts: dict = {}
    os.mkdir("mnt")
    rc = lib.mount(b"tmpfs", b"mnt", b"tmpfs", 0, None)
    facts["mount"] = "mounted" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    rc = lib.unshare(0x10000000)  # CLONE_NEWUSER
    facts["unshare"] = "unshared" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    for name, family in (("inet", socket.AF_INET), ("inet6", socket.AF_INET6), ("unix", socket.AF_UNIX)):
        try:
            socket.socket(family, socket.SOCK_STREAM).close()
            facts[name] = "created"
        except OSError as exc:
            facts[name] = errno.errorcode.get(exc.errno or 0, str(exc))
    facts["pid"] = os.getpid()
    facts["proc"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    try:
        facts["environ"] = len(Path(f"/proc/{params['zygote']}/environ").read_bytes())
    except OSError as exc:
        facts["environ"] = errno.errorcode.get(exc.errno or 0, str(exc))
    return _report(out_dir, facts)


def leave_file(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Writes ``secret.txt`` in the job dir and stays ``params["seconds"]``."""
    (Path.cwd() / "secret.txt").write_text("job A's data")
    time.sleep(params["seconds"])
    return _report(out_dir, {"left": True})


def read_file(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """After ``params["after"]`` seconds, tries to read ``params["path"]`` and list its directory."""
    time.sleep(params["after"])
    facts = {}
    for key, call in (
        ("file", lambda: Path(params["path"]).read_text()),
        ("dir", lambda: os.listdir(os.path.dirname(params["path"]))),
    ):
        try:
            facts[key] = call()
        except OSError as exc:
            facts[key] = errno.errorcode.get(exc.errno or 0, str(exc))
    return _report(out_dir, facts)
