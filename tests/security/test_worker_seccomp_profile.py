"""The worker pods' seccomp profile (deploy/k8s/seccomp/hypermedia-worker.json) loaded for real
(libseccomp, as runc loads it) under the project's Python: the sandbox layers all hold under it,
the calls it leaves out are refused, and without its rule for the sandbox's own calls (what the
runtime's default profile does without CAP_SYS_ADMIN) the probe says which profile to use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO

PROFILE = REPO / "deploy" / "k8s" / "seccomp" / "hypermedia-worker.json"
LOADER = Path(__file__).with_name("seccomp_profile_loader.py")
SYSTEM_PYTHON = "/usr/bin/python3"
UID_BASE = int(os.environ.get("HM_SANDBOX_UID_BASE", "450000"))

pytestmark = pytest.mark.skipif(
    subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True).returncode != 0,
    reason="libseccomp's Python binding is not installed (apt-get install python3-seccomp)",
)


def _under_profile(*command: str, drop: str | None = None) -> subprocess.CompletedProcess[str]:
    options = [str(PROFILE), *(["--drop", drop] if drop else [])]
    return subprocess.run(
        [SYSTEM_PYTHON, str(LOADER), *options, "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _probe(drop: str | None = None) -> dict[str, dict[str, object]]:
    result = _under_profile(sys.executable, "-m", "hypermedia.sandbox.layers", str(UID_BASE), drop=drop)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def test_every_namespace_landlock_and_seccomp_hold_under_the_worker_profile() -> None:
    found = _probe()
    for name in ("userns", "netns", "mountns", "pidns", "ipcns", "landlock", "seccomp"):
        assert found[name]["available"], found[name]


def test_the_calls_the_profile_leaves_out_are_refused() -> None:
    script = (
        "import ctypes, errno, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "out = {}\n"
        "out['ptrace'] = (libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"  # PTRACE_TRACEME
        "out['bpf'] = (libc.syscall(321, 0, 0, 0), ctypes.get_errno())\n"  # x86_64 bpf
        "out['perf_event_open'] = (libc.syscall(298, 0, 0, -1, -1, 0), ctypes.get_errno())\n"
        "out['keyctl'] = (libc.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno())\n"
        "try:\n"
        "    socket.socket(40, socket.SOCK_STREAM)\n"  # AF_VSOCK
        "    out['vsock'] = (0, 0)\n"
        "except OSError as exc:\n"
        "    out['vsock'] = (-1, exc.errno)\n"
        "s = socket.socket(socket.AF_UNIX); s.close(); out['unix'] = (0, 0)\n"
        "import json; print(json.dumps(out))\n"
    )
    result = _under_profile(sys.executable, "-c", script)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for name in ("ptrace", "bpf", "perf_event_open", "keyctl", "vsock"):
        assert out[name] == [-1, 1], (name, out[name])  # EPERM, the profile's default errno
    assert out["unix"] == [0, 0]


def test_without_the_sandbox_rule_the_probe_names_the_profile() -> None:
    found = _probe(drop="the sandbox's layers")
    for name in ("userns", "netns", "mountns", "pidns", "ipcns"):
        assert not found[name]["available"], found[name]
    assert "hypermedia-worker.json" in str(found["userns"]["detail"])
    assert not found["landlock"]["available"]  # landlock_* are in the same rule
