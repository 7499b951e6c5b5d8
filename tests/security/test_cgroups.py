"""Per-job cgroups, for real, on this machine's cgroup v1 memory and pids hierarchies (as root):
a job past its memory limit is OOM-killed alone and ends RESOURCE_LIMIT, a fork bomb stops at
pids.max, a grandchild that left the job's process group dies with the cgroup, the job's group is
removed after it. See docs/security.md ("Per-job cgroups") and hypermedia/sandbox/cgroups.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from hypermedia.sandbox import Sandbox, SandboxLimits, SandboxResult
from hypermedia.sandbox.cgroups import V1Cgroups, join_job_cgroup, open_cgroups

PROBES = "tests.security.cgroup_probes"
UIDS = (430010, 430011) if os.geteuid() == 0 else None
"""This suite's sandbox uids (HM_SANDBOX_UID_BASE range 430000-430099)."""
LIMITS = SandboxLimits(
    cpu_seconds=20,
    wall_seconds=30,
    memory_bytes=8 << 30,  # RLIMIT_AS high: the cgroup is what must stop the job
    fsize_bytes=1 << 20,
    nproc=10_000,  # RLIMIT_NPROC high: pids.max is what must stop a fork bomb
    cgroup_memory_bytes=64 << 20,
    pids=16,
)


@pytest.fixture(scope="module")
def work_dir(tmp_root: Path) -> Path:
    path = tmp_root / f"cgroups-{secrets.token_hex(4)}"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture(scope="module")
async def sandbox(work_dir: Path) -> AsyncIterator[Sandbox]:
    box = Sandbox(work_dir, preload=(PROBES,), uid=UIDS, cgroups="auto")
    await box.start()
    yield box
    await box.close()


async def _run(
    box: Sandbox, entry: str, params: dict | None = None, limits: SandboxLimits = LIMITS
) -> SandboxResult:
    job = f"cg-{secrets.token_hex(6)}"
    job_dir = box.prepare(job)
    try:
        return await box.run(
            job, f"{PROBES}:{entry}", "probe", params or {}, job_dir / "input" / "none", limits
        )
    finally:
        box.cleanup(job)


def _base(box: Sandbox) -> dict[str, str]:
    groups = box._cgroups
    assert isinstance(groups, V1Cgroups), box.cgroups_status
    return groups.base


def _own_cgroup() -> dict[str, str]:
    """This process's /proc/self/cgroup as ``{controllers: path}``."""
    return dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


def _subgroups(path: str) -> list[str]:
    return [p.name for p in Path(path).iterdir() if p.is_dir()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_the_machine_gives_v1_job_groups(sandbox: Sandbox) -> None:
    base = _base(sandbox)
    own = _own_cgroup()
    assert base["memory"].startswith(f"/sys/fs/cgroup/memory{own['memory'].rstrip('/')}/hm-")
    assert base["pids"].startswith(f"/sys/fs/cgroup/pids{own['pids'].rstrip('/')}/hm-")
    assert sandbox.cgroups_status.startswith("cgroup v1: memory at /sys/fs/cgroup/memory/")


async def test_the_job_runs_in_its_own_groups_and_they_are_removed_after(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "own_cgroup")
    assert result.error_code is None, result
    lines = dict(line.split(":", 2)[1:] for line in result.outputs[0].metadata["cgroup"].splitlines())
    memory_job, pids_job = lines["memory"], lines["pids"]
    # A group made with the child ahead of the job (the zygote's spare, ADR 0053), given the
    # job's limits when the job came.
    assert re.fullmatch(r"job-spare-\d+-\d+", memory_job.rsplit("/", 1)[1]), memory_job
    assert pids_job.rsplit("/", 1)[1] == memory_job.rsplit("/", 1)[1]
    assert not _is_dir(f"/sys/fs/cgroup/memory{memory_job}")
    assert not _is_dir(f"/sys/fs/cgroup/pids{pids_job}")
    assert result.cgroup_peak_bytes is not None and 0 < result.cgroup_peak_bytes <= LIMITS.cgroup_memory_bytes
    for d in _base(sandbox).values():  # only the next job's spare
        [spare] = _subgroups(d)
        assert spare.startswith("job-spare-") and spare != memory_job.rsplit("/", 1)[1]


async def test_allocating_past_the_limit_ends_resource_limit_and_the_zygote_serves_on(
    sandbox: Sandbox,
) -> None:
    result = await _run(sandbox, "allocate", {"mib": 256})
    assert (result.error_code, result.error_message) == (
        "RESOURCE_LIMIT",
        "The job exceeded its memory limit.",
    )
    assert result.retryable is False
    assert result.cgroup_peak_bytes is not None
    assert 32 << 20 < result.cgroup_peak_bytes <= LIMITS.cgroup_memory_bytes
    following = await _run(sandbox, "allocate", {"mib": 16})
    assert following.error_code is None, following
    assert following.outputs[0].metadata == {"allocated_mib": 16}


async def test_a_job_whose_limit_is_above_the_spares_gets_it(sandbox: Sandbox) -> None:
    """The child forked ahead of its job waits in a group limited to the zygote's placeholder
    (256 MiB); a job allowed 512 MiB gets its own limit at hand-off (v1: memsw raised first)
    and allocates 300 MiB, which the placeholder would have refused."""
    limits = dataclasses.replace(LIMITS, cgroup_memory_bytes=512 << 20)
    result = await _run(sandbox, "allocate", {"mib": 300}, limits)
    assert result.error_code is None, result
    assert result.outputs[0].metadata == {"allocated_mib": 300}
    assert result.cgroup_peak_bytes is not None and 300 << 20 < result.cgroup_peak_bytes <= 512 << 20


async def test_a_spare_killed_before_its_job_is_replaced(sandbox: Sandbox) -> None:
    """Something outside SIGKILLs the waiting child: the zygote reaps it, removes its group,
    forks another, and the next job runs as ever."""
    assert sandbox._proc is not None
    zygote = psutil.Process(sandbox._proc.pid)
    deadline = time.monotonic() + 5
    while not (spares := [p for p in zygote.children() if p.name() == "hm-spare"]):
        assert time.monotonic() < deadline, "no spare"
        await asyncio.sleep(0.02)
    [spare] = spares
    os.kill(spare.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not [p for p in zygote.children() if p.name() == "hm-spare" and p.pid != spare.pid]:
        assert time.monotonic() < deadline, "no new spare"
        await asyncio.sleep(0.02)
    result = await _run(sandbox, "allocate", {"mib": 16})
    assert result.error_code is None, result
    for d in _base(sandbox).values():
        assert len(_subgroups(d)) == 1  # the next spare's: the killed one's group is gone


async def test_without_the_cgroup_the_same_job_allocates_freely(work_dir: Path) -> None:
    """The control: the 256 MiB the cgroup refuses above fit under the same rlimits alone."""
    box = Sandbox(work_dir, preload=(PROBES,), uid=UIDS, cgroups="off")
    await box.start()
    try:
        result = await _run(box, "allocate", {"mib": 256})
    finally:
        await box.close()
    assert result.error_code is None, result
    assert result.cgroup_peak_bytes is None
    assert result.peak_memory_mb >= 256


async def test_a_fork_bomb_stops_at_pids_max(sandbox: Sandbox) -> None:
    result = await _run(sandbox, "fork_bomb", {"tries": 500})
    assert result.error_code is None, result
    facts = result.outputs[0].metadata
    # pids.max = 16 counts every process of the job's group: with a PID namespace (ADR 0041) the
    # job's parent, pid 1 and the job itself, so 13 children; then fork fails with EAGAIN.
    in_group = 3 if result.layers.get("pidns") else 1
    assert facts == {"started": LIMITS.pids - in_group, "refused": "EAGAIN"}


def test_kill_all_reaches_a_process_that_left_the_job_s_session_and_group() -> None:
    """The cgroup's kill reaches what the process-group kill and the uid sweep cannot: a process
    in a session of its own, reparented away from the job (a PID namespace kills it too, when the
    kernel gives one: ADR 0041; this is the layer for workers without user namespaces)."""
    groups = open_cgroups("auto")
    assert isinstance(groups, V1Cgroups)
    try:
        job = groups.create(f"escape-{secrets.token_hex(3)}", 64 << 20, 16)
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:
            join_job_cgroup(job.procs_files)
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                time.sleep(120)
            os._exit(0)
        os.close(w)
        os.waitpid(middle, 0)
        escaped = int(os.read(r, 32))
        os.close(r)
        assert _alive(escaped)  # left behind by its parent, in its own session
        assert job.kill_all() >= 1
        deadline = time.monotonic() + 5
        while _alive(escaped) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(escaped)
        assert job.remove()
    finally:
        groups.close()


async def test_close_removes_the_base_groups(work_dir: Path) -> None:
    box = Sandbox(work_dir, preload=(PROBES,), uid=UIDS, cgroups="auto")
    await box.start()
    base = dict(_base(box))
    assert all(_is_dir(d) for d in base.values())
    await box.close()
    assert not any(_is_dir(d) for d in base.values())


def test_a_path_outside_the_own_cgroup_is_refused() -> None:
    outside = "/elsewhere-" + secrets.token_hex(3)
    assert _own_cgroup()["memory"] != "/", "this test expects a nested memory cgroup, as on this machine"
    groups = open_cgroups(outside)
    assert not isinstance(groups, V1Cgroups)
    assert groups.reason.startswith(f"HM_SANDBOX_CGROUP={outside} is not nested under this process's cgroup")


def test_a_killed_workers_groups_are_removed_by_the_next_one() -> None:
    """A worker SIGKILLed before close leaves ``hm-<pid>-<n>`` with a job group and a process in it:
    the next worker's open removes both and kills the process."""
    own = open_cgroups("auto")
    assert isinstance(own, V1Cgroups)
    own.close()
    parents = {c: os.path.dirname(d) for c, d in own.base.items()}
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)  # a pid with no /proc entry now
    stale = V1Cgroups({c: f"{p}/hm-{gone}-1" for c, p in parents.items()})
    for d in stale.base.values():
        os.mkdir(d)
    job = stale.create("left", 64 << 20, 16)
    sleeper = os.fork()
    if sleeper == 0:
        join_job_cgroup(job.procs_files)
        time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    groups = open_cgroups("auto")
    try:
        assert not any(_is_dir(d) for d in stale.base.values())
        _, status = os.waitpid(sleeper, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        assert isinstance(groups, V1Cgroups)
        groups.close()


def test_without_a_delegated_subtree_the_answer_is_unavailable_with_the_reason() -> None:
    """An unprivileged uid (430030) on this machine's root-owned v1 hierarchies: nothing is
    delegated, so open_cgroups says why and how to grant it, and makes nothing."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(430030)
            os.setuid(430030)
            groups = open_cgroups("auto")
            os.write(w, (getattr(groups, "reason", None) or "available").encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    reason = os.read(r, 4096).decode()
    assert reason.startswith("cannot create a job group under /sys/fs/cgroup/memory/"), reason
    assert "Permission denied; run the container with a private cgroup namespace" in reason
    named = reason.split(" under ", 1)[1].split(":", 1)[0]
    assert re.search(rf"/hm-{pid}-\d+$", named) and not _is_dir(named), named
