"""Entries for tests/unit/test_sandbox.py; each runs inside a sandbox child.

Signature of every entry: ``(operation, params, input_path, out_dir, **kwargs) -> list[OutputFile]``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.imaging import ops


def _info(out_dir: Path, metadata: dict) -> list[OutputFile]:
    (out_dir / "info.txt").write_text("ok")
    return [OutputFile("info", "info.txt", "text/plain", metadata)]


def identity(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Who and where the child is, as the entry sees it."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    return _info(
        out_dir,
        {
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": os.getgroups(),
            "cwd": os.getcwd(),
            "umask": os.umask(0o077),
            "env": dict(os.environ),
            "pgid": os.getpgid(0),
            "pid": os.getpid(),
            "no_new_privs": status.get("NoNewPrivs", "").strip(),
            "netns": os.readlink("/proc/self/ns/net"),
            "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        },
    )


def noop(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    return []


def sleep_forever(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Writes its pid and a grandchild's pid to pids.txt in the job dir, then sleeps."""
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(600)
        os._exit(0)
    Path("pids.txt").write_text(f"{os.getpid()} {grandchild}")
    time.sleep(600)
    return []


def spin(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    while True:
        pass


def spin_in_processes(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Forks one process after another, each spinning for 0.2 s of CPU time and waited for, as an
    engine running a process per page does: no process comes near the job's RLIMIT_CPU."""
    while True:
        pid = os.fork()
        if pid == 0:
            started = time.process_time()
            while time.process_time() - started < 0.2:
                pass
            os._exit(0)
        os.waitpid(pid, 0)


def allocate(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    blob = bytearray(params["bytes"])
    return _info(out_dir, {"len": len(blob)})


def write_big(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    with open(out_dir / "big.bin", "wb") as f:
        f.write(b"\0" * params["bytes"])
    return []


def segfault(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    os.kill(os.getpid(), signal.SIGSEGV)
    return []


def fail_permanent(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    raise PermanentJobError("The image is broken.", "CORRUPT_INPUT")


def fail_internal(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    raise RuntimeError("secret detail /etc/passwd")


def symlink_output(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    (out_dir / "leak.txt").symlink_to("/etc/passwd")
    return [OutputFile("leak", "leak.txt", "text/plain", {})]


def image_threads(
    operation: str, params: dict, input_path: Path, out_dir: Path, *, limits: ops.ImageLimits
) -> list[OutputFile]:
    """Runs an image operation and reports the highest thread count seen while it ran."""
    import threading

    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(os.listdir("/proc/self/task")))
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    outputs = ops.run(operation, params, input_path, out_dir, limits)
    stop.set()
    watcher.join()
    return [*outputs, *_info(out_dir, {"peak_threads_without_watcher": peak - 1})]
