"""Code-level probes run inside the real sandbox: each tries to break out of one limit.

Every probe holds with and without root (docs/adr/0041): the job's user namespace owns its
network, mount, IPC and PID namespaces, its capabilities are dropped, and Landlock and the
seccomp filter apply. Root adds the per-slot uid. tests/security/test_sandbox_unprivileged.py runs
this module again as an unprivileged user. See docs/security.md."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from hypermedia.sandbox import (
    SHARED_WRITABLE_DIRS,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    read_output,
)
from hypermedia.sandbox.confine import _closed_ancestors, _code_dirs, _uid_tasks
from tests.security.conftest import Listener

PROBES = "tests.security.probes"
LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_bytes=512 << 20, fsize_bytes=1 << 20)
IS_ROOT = os.geteuid() == 0
UIDS = (420000, 420001)
"""Sandbox uids under root (this helper's range, HM_SANDBOX_UID_BASE=420000)."""


@pytest.fixture(scope="module")
def work_dir(tmp_root: Path) -> Path:
    """Under /tmp on purpose: the job dir must stay writable when /tmp is hidden from the job."""
    path = tmp_root / f"probes-{secrets.token_hex(4)}"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture(scope="module")
async def sandbox(work_dir: Path) -> AsyncIterator[Sandbox]:
    box = Sandbox(work_dir, preload=(PROBES,), uid=UIDS if IS_ROOT else None)
    await box.start()
    yield box
    await box.close()


async def _run(
    box: Sandbox, entry: str, params: dict | None = None, limits: SandboxLimits = LIMITS
) -> SandboxResult:
    job = f"probe-{secrets.token_hex(6)}"
    job_dir = box.prepare(job)
    try:
        return await box.run(
            job, f"{PROBES}:{entry}", "probe", params or {}, job_dir / "input" / "none", limits
        )
    finally:
        box.cleanup(job)


def _facts(result: SandboxResult) -> dict:
    assert result.error_code is None, result
    return dict(result.outputs[0].metadata)


async def test_rlimits_and_no_core_dumps(sandbox: Sandbox) -> None:
    facts = _facts(await _run(sandbox, "limits"))
    assert facts["RLIMIT_CPU"] == [5, 6]
    assert facts["RLIMIT_AS"] == [512 << 20, 512 << 20]
    assert facts["RLIMIT_FSIZE"] == [1 << 20, 1 << 20]
    assert facts["RLIMIT_NPROC"] == [16, 16]
    assert facts["RLIMIT_CORE"] == [0, 0]


async def test_fork_bomb_stops_at_the_process_limit_and_dies_with_the_job(sandbox: Sandbox) -> None:
    facts = _facts(await _run(sandbox, "fork_bomb"))
    assert facts["refused"] == "EAGAIN" and facts["started"] < 16
    # The children slept; the job's process group was killed with the job (SIGKILL is
    # asynchronous: give the kernel and the zygote, their subreaper, a moment to finish them).
    await _no_stragglers(sandbox)


async def _no_stragglers(box: Sandbox) -> None:
    """Waits (at most 5 s) until the zygote has no descendant left and, under root, no process of
    the sandbox uids lives: what a job started is gone with it."""
    assert box._proc is not None
    zygote = psutil.Process(box._proc.pid)
    deadline = time.monotonic() + 5
    while stragglers := [
        p.pid
        for p in zygote.children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and p.name() != "hm-spare"  # the next job's child
    ] + (_alive_with_uids(*UIDS) if IS_ROOT else []):
        assert time.monotonic() < deadline, stragglers
        await asyncio.sleep(0.05)


def _alive_with_uids(*uids: int) -> list[tuple[int, str]]:
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        if (
            proc.info["uids"]
            and proc.info["uids"].real in uids
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append((proc.pid, proc.info["status"]))
    return found


async def test_no_network_not_even_loopback(sandbox: Sandbox, listener: Listener) -> None:
    """Refused before any connect: seccomp allows AF_UNIX sockets only."""
    facts = _facts(await _run(sandbox, "connect", {"port": listener.port}))
    assert facts == {"127.0.0.1": "EAFNOSUPPORT", "1.1.1.1": "EAFNOSUPPORT"}
    assert listener.connections == []


async def test_nothing_outside_the_job_dir_is_writable(sandbox: Sandbox, work_dir: Path) -> None:
    targets = [*SHARED_WRITABLE_DIRS, str(work_dir), str(work_dir / "jobs"), str(Path.cwd()), "/etc", "/root"]
    targets = [t for t in targets if os.access(t, os.R_OK | os.X_OK)]  # listable by this user
    before = {t: sorted(os.listdir(t)) for t in targets}
    facts = _facts(await _run(sandbox, "write_outside", {"paths": targets}))
    assert facts.pop("job_dir") == "written"
    assert {t: facts[t] for t in targets if facts[t] == "written"} == {}
    # ENOENT: a directory under /tmp (say, a checkout in /tmp) is not even there for the job.
    assert all(facts[t] in ("EROFS", "EACCES", "EPERM", "ENOENT") for t in targets), facts
    for t in targets:
        assert not (Path(t) / "hm-probe-escape").exists()
        if t != str(work_dir / "jobs"):  # the job's own dir came and went there
            assert sorted(os.listdir(t)) == before[t]


async def test_a_job_imports_the_standard_library_lazily_and_sees_nothing_else_of_its_home(
    sandbox: Sandbox,
) -> None:
    """A job imports a standard library module the zygote did not (RapidOCR's ``difflib``, when
    it escalates a page) even when Python lives under a directory its uid may not search, such
    as a pyenv Python under ``/root`` (mode 0700): that directory is covered in the job's mount
    namespace and the installation bound back read-only; nothing else of it shows."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])  # noqa: ASYNC240
    modules = ["tabnanny", "mailbox"]  # the zygote preloads the probes only, and they import neither
    facts = _facts(await _run(sandbox, "late_imports", {"modules": modules, "paths": ["/root"]}))
    assert {m: facts[m] for m in modules} == {m: "imported" for m in modules}
    closed = _closed_ancestors((stdlib,))
    if "/root" in closed:
        # The tmpfs holds only the way to the installation.
        assert facts["/root"] == [Path(stdlib).relative_to("/root").parts[0]]
    elif stdlib.startswith("/root/"):
        # /root searchable (the unprivileged run's own mount namespace): still only that way.
        assert facts["/root"] in ("EACCES", [Path(stdlib).relative_to("/root").parts[0]])
    else:
        assert facts["/root"] in ("EACCES", [])


def test_the_code_dirs_hold_the_checkout_and_the_python() -> None:
    """What a job's mount namespace binds back read-only: the checkout that holds the ``hypermedia``
    package (a job may read files in it, e.g. a ``TESSDATA_PREFIX`` there), the venv and the
    standard library; not a directory inside the package (as after the package moved to
    ``hypermedia/sandbox/`` and still counted one parent up)."""
    checkout = Path(__file__).resolve().parents[2]
    assert (checkout / "hypermedia" / "__init__.py").is_file()
    dirs = _code_dirs()
    assert str(checkout) in dirs
    assert os.path.realpath(sys.prefix) in dirs and os.path.realpath(sys.base_prefix) in dirs


def test_closed_ancestors_are_the_topmost_unsearchable_ones() -> None:
    base = Path(tempfile.mkdtemp())  # directly in /tmp (pytest's own dirs are 0700)
    try:
        base.chmod(0o755)
        (base / "open" / "closed" / "inner" / "code").mkdir(parents=True)
        (base / "open").chmod(0o755)
        (base / "open" / "closed").chmod(0o700)
        (base / "open" / "closed" / "inner").chmod(0o700)
        code = str(base / "open" / "closed" / "inner" / "code")
        assert _closed_ancestors((code,)) == (str(base / "open" / "closed"),)
        assert _closed_ancestors((str(base / "open" / "x"),)) == ()
        assert _closed_ancestors(("/usr/lib/python3",)) == ()
    finally:
        shutil.rmtree(base)


async def test_memory_cpu_and_file_size_probes_end_with_specific_codes(sandbox: Sandbox) -> None:
    """Allocation, spinning and writing past the limits: RESOURCE_LIMIT / TIMEOUT, fast."""
    entries = "tests.unit.sandbox_entries"
    box = Sandbox(sandbox.work_dir, preload=(entries,), uid=(420002,) if IS_ROOT else None)
    await box.start()
    try:
        for entry, params, code in (
            ("allocate", {"bytes": 1 << 30}, "RESOURCE_LIMIT"),
            ("write_big", {"bytes": 2 << 20}, "RESOURCE_LIMIT"),
            ("spin", {}, "TIMEOUT"),
        ):
            job = f"probe-{secrets.token_hex(6)}"
            job_dir = box.prepare(job)
            limits = SandboxLimits(cpu_seconds=1, wall_seconds=5, memory_bytes=512 << 20, fsize_bytes=1 << 20)
            result = await box.run(
                job, f"{entries}:{entry}", "probe", params, job_dir / "input" / "none", limits
            )
            box.cleanup(job)
            assert result.error_code == code, (entry, result)
            assert result.duration_ms < 5000
    finally:
        await box.close()


async def test_an_output_dir_swapped_for_a_symlink_gives_nothing_of_the_target(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir(mode=0o755)
    (secret_dir / "key.pem").write_text("PRIVATE KEY")
    (secret_dir / "key.pem").chmod(0o600)  # root's, not the job's
    job = f"probe-{secrets.token_hex(6)}"
    job_dir = sandbox.prepare(job)
    try:
        result = await sandbox.run(
            job,
            f"{PROBES}:swap_output_dir",
            "probe",
            {"target": str(secret_dir), "name": "key.pem"},
            job_dir / "input" / "none",
            LIMITS,
        )
        assert (result.error_code, result.outputs) == ("INTERNAL", [])
        # And reading it the way the worker uploads outputs refuses the symlink.
        with pytest.raises(OSError) as refused:
            read_output(job_dir, "key.pem")
        assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)  # O_NOFOLLOW|O_DIRECTORY on a symlink
    finally:
        sandbox.cleanup(job)
    assert (secret_dir / "key.pem").read_text() == "PRIVATE KEY"


async def test_a_hard_linked_output_is_refused(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "hard_linked_output")
    assert (result.error_code, result.outputs) == ("INTERNAL", [])


async def test_a_grandchild_in_its_own_session_dies_with_the_job(sandbox: Sandbox) -> None:
    """setsid takes a process out of the job's group; the job runs in a PID namespace whose pid 1
    exits with it, and the kernel then kills everything left in the namespace."""
    assert _facts(await _run(sandbox, "escape_session")) == {"escaped": True}
    await _no_stragglers(sandbox)


def test_without_a_sandbox_uid_the_process_limit_counts_the_uids_tasks() -> None:
    """What RLIMIT_NPROC is raised by when jobs share the worker's uid (no root)."""
    assert _uid_tasks(os.getuid()) >= threading.active_count()


def _zygote_pid(box: Sandbox) -> int:
    assert box._proc is not None
    return box._proc.pid


async def test_ptrace_of_the_zygote_kills_the_job_with_sandbox_violation(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "ptrace_attach", {"pid": _zygote_pid(sandbox)})
    assert (result.error_code, result.retryable, result.outputs) == ("SANDBOX_VIOLATION", False, [])
    assert result.error_message is not None and "system call" in result.error_message
    assert psutil.Process(_zygote_pid(sandbox)).status() != psutil.STATUS_TRACING_STOP


async def test_process_vm_readv_kills_the_job_with_sandbox_violation(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "vm_read", {"pid": _zygote_pid(sandbox), "address": 0x400000})
    assert (result.error_code, result.outputs) == ("SANDBOX_VIOLATION", [])
    # The zygote survives and takes the next job.
    assert (await _run(sandbox, "limits")).error_code is None


async def test_mounts_namespaces_and_inet_sockets_are_refused_and_proc_shows_the_job_alone(
    sandbox: Sandbox,
) -> None:
    facts = _facts(await _run(sandbox, "refused_calls", {"zygote": _zygote_pid(sandbox)}))
    assert facts["mount"] == "EPERM"
    assert facts["unshare"] == "EPERM"
    assert (facts["inet"], facts["inet6"], facts["unix"]) == ("EAFNOSUPPORT", "EAFNOSUPPORT", "created")
    # pid 2 of its own PID namespace, under the namespace's init: all its /proc shows.
    assert (facts["pid"], facts["proc"]) == (2, [1, 2])
    assert facts["environ"] == "ENOENT"  # the zygote is not in the job's /proc at all


async def test_every_layer_is_reported_applied(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "limits")
    assert result.error_code is None
    assert dict(result.layers) == {
        "userns": True,
        "netns": True,
        "mountns": True,
        "ipcns": True,
        "pidns": True,
        "procns": True,
        "caps_dropped": True,
        "landlock": True,
        "seccomp": True,
    }


async def test_a_job_cannot_read_another_running_jobs_directory(sandbox: Sandbox) -> None:
    """Two jobs at once: A leaves a file in its dir and stays; B, started after it, cannot open
    it nor list A's dir (``jobs/`` holds B's own dir alone in B's mount namespace)."""
    a, b = f"probe-{secrets.token_hex(6)}", f"probe-{secrets.token_hex(6)}"
    a_dir, b_dir = sandbox.prepare(a), sandbox.prepare(b)
    try:
        holder = asyncio.create_task(
            sandbox.run(
                a, f"{PROBES}:leave_file", "probe", {"seconds": 2.0}, a_dir / "input" / "none", LIMITS
            )
        )
        deadline = time.monotonic() + 5
        while not (a_dir / "secret.txt").exists():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        reader = await sandbox.run(
            b,
            f"{PROBES}:read_file",
            "probe",
            {"path": str(a_dir / "secret.txt"), "after": 0.0},
            b_dir / "input" / "none",
            LIMITS,
        )
        assert _facts(await holder) == {"left": True}
    finally:
        sandbox.cleanup(a)
        sandbox.cleanup(b)
    assert _facts(reader) == {"file": "ENOENT", "dir": "ENOENT"}


_REFUSING_WORKER = """
import asyncio, json, sys
from pathlib import Path
from hypermedia.sandbox import Sandbox, SandboxLimits, seccomp
from hypermedia.sandbox.confine import _PR_SET_NO_NEW_PRIVS, _prctl

_prctl(_PR_SET_NO_NEW_PRIVS, 1)
seccomp.install()  # refuses unshare and mount (EPERM) to this worker, its zygote and the jobs


async def main() -> None:
    work_dir = Path(sys.argv[1])
    box = Sandbox(work_dir, preload=("tests.security.probes",), uid=json.loads(sys.argv[2]))
    await box.start()
    job_dir = box.prepare("refused")
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_bytes=512 << 20, fsize_bytes=1 << 20)
    params = {"paths": [str(work_dir)]}
    result = await box.run("refused", "tests.security.probes:write_outside", "probe", params, job_dir / "none", limits)
    facts = result.outputs[0].metadata if result.outputs else None
    box.cleanup("refused")
    job_dir = box.prepare("forks")  # the process limit leaves room for a few forks
    forks = await box.run("forks", "tests.security.probes:fork_bomb", "probe", {}, job_dir / "none", limits)
    await box.close()
    print(json.dumps({"error_code": result.error_code, "layers": dict(result.layers), "facts": facts,
                      "forks": forks.outputs[0].metadata if forks.outputs else forks.error_code}))


asyncio.run(main())
"""


def test_where_the_kernel_refuses_namespaces_the_job_still_runs_without_capabilities_under_landlock_and_seccomp(
    work_dir: Path,
) -> None:
    """A worker whose own seccomp policy refuses ``unshare`` (as a container runtime's default
    profile does): every namespace layer is reported false, the job runs, and Landlock alone keeps
    it from writing the worker's work dir."""
    refusing = work_dir / f"refusing-{secrets.token_hex(4)}"
    refusing.mkdir(mode=0o755)
    run = subprocess.run(
        [sys.executable, "-c", _REFUSING_WORKER, str(refusing), json.dumps([420003] if IS_ROOT else None)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["error_code"] is None, outcome
    layers = outcome["layers"]
    assert {k: layers[k] for k in ("userns", "netns", "mountns", "ipcns", "pidns")} == dict.fromkeys(
        ("userns", "netns", "mountns", "ipcns", "pidns"), False
    )
    assert (layers["caps_dropped"], layers["landlock"], layers["seccomp"]) == (True, True, True)
    assert outcome["facts"] == {str(refusing): "EACCES", "job_dir": "written"}
    assert outcome["forks"]["refused"] == "EAGAIN" and 10 <= outcome["forks"]["started"] <= 16, outcome
    assert not (refusing / "hm-probe-escape").exists()
