"""The layer probe (hypermedia/sandbox/layers.py) and fail-closed start: each layer really tried in
a child; a layer the kernel refuses (a seccomp filter that refuses ``unshare``, installed for real
before the probe) is reported missing with its remedy, and a worker that requires it exits 78 with
one line naming it; a running worker reports its layers in ``GetStatus``."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.sandbox import layers
from tests.e2e.conftest import REPO, RunningPlatform, isolated_platform

IS_ROOT = os.geteuid() == 0
UID_BASE = int(os.environ.get("HM_SANDBOX_UID_BASE", "450000"))

# A seccomp filter that answers EPERM to unshare(2) (x86_64: 272) and allows everything else,
# installed with no_new_privs, then the rest of the command runs under it (exec keeps it).
REFUSE_UNSHARE = textwrap.dedent(
    """
    import ctypes, os, sys
    class F(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
    prog = (F * 4)(
        F(0x20, 0, 0, 0),             # ld [nr]
        F(0x15, 0, 1, 272),           # jeq unshare
        F(0x06, 0, 0, 0x00050000 | 1),  # ret ERRNO(EPERM)
        F(0x06, 0, 0, 0x7FFF0000),    # ret ALLOW
    )
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0
    assert libc.prctl(22, 2, ctypes.byref(P(4, prog)), 0, 0) == 0
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    """
)

x86_64_only = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the filter hard-codes x86_64's unshare number"
)


def test_every_layer_this_machine_offers_is_found() -> None:
    found = {layer.name: layer for layer in layers.probe_layers_fresh(UID_BASE)}
    assert tuple(found) == layers.LAYER_NAMES
    # This machine: unprivileged user namespaces (unshare -Urn works as nobody), Landlock ABI 7,
    # seccomp; as root also the uid switch and cgroup v1 memory and pids under our own cgroup.
    for name in ("userns", "netns", "mountns", "pidns", "ipcns", "landlock", "seccomp"):
        assert found[name].available, found[name]
    assert found["landlock"].detail.startswith("ABI ") and int(found["landlock"].detail[4:]) >= 1
    if IS_ROOT:
        assert found["uid_switch"].available and str(UID_BASE) in found["uid_switch"].detail
        assert found["cgroups"].available, found["cgroups"]
        assert "as root" in found["netns"].detail
    else:
        assert not found["uid_switch"].available and "needs root" in found["uid_switch"].detail
        assert "inside a user namespace" in found["netns"].detail
        if os.environ.get("HM_SECURITY_UNPRIVILEGED") == "1":
            # scripts/test_unprivileged.sh delegated a subtree to the user, as a container runtime
            # does: the worker's own groups are that subtree.
            assert found["cgroups"].available, found["cgroups"]
            assert "/hm-unprivileged-" in found["cgroups"].detail
        else:
            # The host's cgroups are root's: nothing is delegated to an unprivileged user.
            assert not found["cgroups"].available and "no delegated cgroup" in found["cgroups"].detail


@x86_64_only
def test_a_refused_unshare_is_reported_missing_with_the_remedy(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(
        "import json\nfrom hypermedia.sandbox import layers\n"
        f"print(json.dumps([l.__dict__ for l in layers.probe_layers({UID_BASE})]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", REFUSE_UNSHARE, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import json

    found = {row["name"]: row for row in json.loads(out.stdout)}
    for name in ("userns", "netns", "mountns", "pidns", "ipcns"):
        assert not found[name]["available"], found[name]
        assert "EPERM" in found[name]["detail"]
    assert "seccomp profile" in found["userns"]["detail"]
    assert "hypermedia-worker.json" in found["userns"]["detail"]
    # What the filter does not touch still holds.
    assert found["landlock"]["available"] and found["seccomp"]["available"]


def test_require_values() -> None:
    assert layers.parse_require("full") == layers.FULL_LAYERS
    assert "uid_switch" not in layers.FULL_LAYERS
    assert layers.parse_require("best-effort") == ()
    assert layers.parse_require(" netns, landlock ,netns") == ("netns", "landlock")
    for bad in ("", "everything", "netns,bogus"):
        with pytest.raises(ValueError, match="HM_SANDBOX_REQUIRE"):
            layers.parse_require(bad)
    held = layers.Layer("netns", True, "as root")
    gone = layers.Layer("cgroups", False, "no delegated cgroup (x): chown it")
    layers.check_required([held, gone], ["netns"])
    with pytest.raises(layers.LayersMissing) as missing:
        layers.check_required([held, gone], ["netns", "cgroups"])
    assert str(missing.value) == (
        "sandbox layers required by HM_SANDBOX_REQUIRE are missing: cgroups: no delegated cgroup (x): chown it"
    )


def _worker_env(**extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HM_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "HM_NATS_URL": "nats://127.0.0.1:1",
        "HM_SANDBOX_UID_BASE": str(UID_BASE),
        **extra,
    }


@x86_64_only
def test_a_worker_missing_a_required_layer_exits_78_naming_it(tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", REFUSE_UNSHARE, "-m", "services.imageworker"],
        cwd=REPO,
        env=_worker_env(HM_SANDBOX_REQUIRE="full", HM_WORK_DIR=str(tmp_path / "work")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78, result.stderr
    line = [x for x in result.stderr.splitlines() if x.startswith("imageworker: sandbox layers")]
    assert len(line) == 1, result.stderr
    for name in ("userns", "netns", "mountns", "pidns", "ipcns"):
        assert f" {name}: " in line[0]
    assert "landlock:" not in line[0] and "seccomp profile" in line[0]
    # It stopped at the probe, before any dependency was tried (Postgres here is unreachable).
    assert time.monotonic() - started < 20


def test_an_unknown_required_layer_is_a_configuration_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.imageworker"],
        cwd=REPO,
        env=_worker_env(HM_SANDBOX_REQUIRE="netns,chroot", HM_WORK_DIR=str(tmp_path / "work")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78
    assert "HM_SANDBOX_REQUIRE" in result.stderr and "chroot" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "layers", services="credits,storage,gateway,imageworker"
    ) as running:
        yield running


def test_hypermedia_up_runs_workers_best_effort_and_says_which_layers_hold(
    idle_platform: RunningPlatform,
) -> None:
    up_log = (idle_platform.state_dir / "up.log").read_text()
    lines = [x for x in up_log.splitlines() if x.startswith("hypermedia up: workers run with")]
    expected = layers.probe_layers_fresh(UID_BASE)
    held = ", ".join(layer.name for layer in expected if layer.available)
    assert len(lines) == 1, up_log[-2000:]
    assert lines[0].startswith(
        f"hypermedia up: workers run with HM_SANDBOX_REQUIRE=best-effort; layers that hold: {held};"
    )


def test_a_running_worker_reports_its_layers_in_get_status(idle_platform: RunningPlatform) -> None:
    address = idle_platform.info["workers"]["imageworker"]
    deadline = time.monotonic() + 60
    while True:
        try:
            with idle_platform.internal_channel(address) as chan:
                status = worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(
                    worker_pb2.GetStatusRequest(), timeout=2
                )
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert status.sandbox_require == "best-effort"
    reported = {layer.name: layer for layer in status.sandbox_layers}
    assert tuple(reported) == layers.LAYER_NAMES
    # The same answers as a probe from this process (same uid), uid_switch aside: the platform's
    # worker probes its own pool uid.
    expected = {layer.name: layer.available for layer in layers.probe_layers_fresh(UID_BASE)}
    assert {name: layer.available for name, layer in reported.items()} == expected
    assert reported["landlock"].detail.startswith("ABI ")
    worker_log = (idle_platform.state_dir / "logs" / "imageworker.log").read_text()
    assert "sandbox layers: userns=yes" in worker_log
