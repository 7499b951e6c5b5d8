"""Sandbox entries for the per-job cgroup tests (tests/security/test_cgroups.py): each pushes on
one cgroup limit from inside a job and reports what it saw."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from hypermedia.engines.contract import OutputFile


def _report(out_dir: Path, facts: dict) -> list[OutputFile]:
    (out_dir / "report.txt").write_text("ok")
    return [OutputFile("report", "report.txt", "text/plain", facts)]


def allocate(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Allocate and touch ``params["mib"]`` MiB, one filled MiB at a time (every page written)."""
    chunks = [bytes([i % 251 + 1]) * (1 << 20) for i in range(int(params["mib"]))]
    return _report(out_dir, {"allocated_mib": len(chunks)})


def fork_bomb(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Fork until refused (at most ``params["tries"]``); the children sleep."""
    started, refused = 0, None
    for _ in range(int(params["tries"])):
        try:
            pid = os.fork()
        except OSError as exc:
            refused = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
    return _report(out_dir, {"started": started, "refused": refused})


def escape(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Leave a grandchild behind in a session of its own (out of the job's process group),
    reparented to the zygote when its parent exits; report its pid."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(120)
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(w)
    return _report(out_dir, {"grandchild": int(os.read(r, 64))})


def sleep(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Sleep ``params["seconds"]``."""
    time.sleep(float(params["seconds"]))
    return _report(out_dir, {})


def own_cgroup(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Report /proc/self/cgroup as the job sees it."""
    return _report(out_dir, {"cgroup": Path("/proc/self/cgroup").read_text()})
