"""Sandbox entries for the per-job cgroup tests (tests/security/test_cgroups.py): each pushes on
one cgroup limit from inside a job and reports what it saw."""

from __future__ import annotations

from pathlib import Path

from hypermedia.engines.contract import OutputFile
from tests.security.probes import _report, fork_bomb

__all__ = ["allocate", "fork_bomb", "own_cgroup"]


def allocate(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Allocate and touch ``params["mib"]`` MiB, one filled MiB at a time (every page written)."""
    chunks = [bytes([i % 251 + 1]) * (1 << 20) for i in range(int(params["mib"]))]
    return _report(out_dir, {"allocated_mib": len(chunks)})


def own_cgroup(operation: str, params: dict, input_path: Path, out_dir: Path) -> list[OutputFile]:
    """Report /proc/self/cgroup as the job sees it."""
    return _report(out_dir, {"cgroup": Path("/proc/self/cgroup").read_text()})
