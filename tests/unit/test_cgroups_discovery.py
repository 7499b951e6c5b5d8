"""Discovery of a process's cgroups from /proc/self/cgroup and /proc/self/mountinfo texts
(hypermedia/sandbox/cgroups.py). The v2 cases use texts in the format of a cgroup v2 host (this
machine has no v2 controllers: its v1 path is tested for real in tests/security/test_cgroups.py);
the v2 refusal runs against this machine's real, controller-less unified hierarchy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypermedia.sandbox.cgroupfind import (
    CgroupError,
    Discovery,
    Unavailable,
    discover,
    parse_mountinfo,
    parse_proc_cgroup,
)
from hypermedia.sandbox.cgroups import open_cgroups, platform_setting

V1_HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/8c60a69bd91660103481b9389c03c403
1:cpu,cpuacct:/
0::/
"""
V1_HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_CGROUP = "0::/system.slice/hypermedia-worker.service\n"
"""A v2-only host (systemd unit), format of /proc/self/cgroup on e.g. Debian 12."""
V2_MOUNTINFO = """\
22 29 0:20 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 21 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
V2_CGROUPNS_CGROUP = "0::/\n"
"""Inside a container with a private cgroup namespace (docker --cgroupns=private, Kubernetes on v2):
the own group is the namespace root."""
V2_CGROUPNS_MOUNTINFO = (
    "1210 1201 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n"
)
V2_HOST_MOUNT_IN_NS = (
    "1210 1201 0:26 /.. /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n"
)
"""A host's cgroup2 mount seen from inside a cgroup namespace: its root lies outside the namespace."""


def test_v1_hybrid_as_on_this_machine() -> None:
    found = discover(V1_HYBRID_CGROUP, V1_HYBRID_MOUNTINFO)
    assert found == Discovery(
        1,
        {
            "memory": "/sys/fs/cgroup/memory/process_api/8c60a69bd91660103481b9389c03c403",
            "pids": "/sys/fs/cgroup/pids",
        },
        {"memory": "/process_api/8c60a69bd91660103481b9389c03c403", "pids": "/"},
    )


def test_this_machines_real_files_are_v1() -> None:
    found = discover(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    assert isinstance(found, Discovery) and found.version == 1
    assert found.dirs["memory"].startswith("/sys/fs/cgroup/memory/")
    assert Path(found.dirs["memory"], "memory.limit_in_bytes").is_file()
    assert Path(found.dirs["pids"], "cgroup.procs").is_file()


def test_v2_unified_host() -> None:
    found = discover(V2_CGROUP, V2_MOUNTINFO)
    assert found == Discovery(
        2,
        {"": "/sys/fs/cgroup/system.slice/hypermedia-worker.service"},
        {"": "/system.slice/hypermedia-worker.service"},
    )


def test_v2_private_cgroup_namespace() -> None:
    assert discover(V2_CGROUPNS_CGROUP, V2_CGROUPNS_MOUNTINFO) == Discovery(
        2, {"": "/sys/fs/cgroup"}, {"": "/"}
    )


def test_v2_mount_that_does_not_show_the_own_group_is_unavailable() -> None:
    found = discover(V2_CGROUPNS_CGROUP, V2_HOST_MOUNT_IN_NS)
    assert isinstance(found, Unavailable)
    assert found.reason.startswith("no cgroup2 mount shows this process's group /;")
    assert "cgroupns=private" in found.reason


def test_v1_mount_rooted_inside_the_hierarchy() -> None:
    """A v1 mount of a sub-tree (mountinfo root /docker/abc), as a container without cgroupns sees it."""
    mountinfo = (
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
        "39 31 0:36 /docker/abc /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n"
    )
    found = discover("4:memory:/docker/abc/w\n8:pids:/docker/abc\n", mountinfo)
    assert isinstance(found, Discovery)
    assert found.dirs == {"memory": "/sys/fs/cgroup/memory/w", "pids": "/sys/fs/cgroup/pids"}


def test_mixed_hierarchies_are_unavailable() -> None:
    found = discover("4:memory:/a\n0::/b\n", V1_HYBRID_MOUNTINFO)
    assert isinstance(found, Unavailable)
    assert (
        found.reason
        == "controllers ['memory'] are on cgroup v1 but ['pids'] are not; mixed hierarchies are not supported"
    )


def test_escaped_mount_point() -> None:
    (mount,) = parse_mountinfo("41 31 0:38 / /sys/fs/cgroup/my\\040cg rw - cgroup2 cgroup2 rw\n")
    assert mount.mount_point == "/sys/fs/cgroup/my cg"


def test_malformed_proc_cgroup_is_a_clear_error() -> None:
    with pytest.raises(CgroupError, match="unexpected /proc/self/cgroup line 'garbage'"):
        parse_proc_cgroup("garbage\n")
    assert parse_proc_cgroup("1:cpu,cpuacct:/x\n") == {"cpu": "/x", "cpuacct": "/x"}


def test_v2_without_controllers_for_real_says_why() -> None:
    """This machine's real unified hierarchy (/sys/fs/cgroup/unified, no memory or pids controller),
    as a v2 host would present it: unavailable, naming the file and how to delegate."""
    groups = open_cgroups("auto", proc_cgroup="0::/\n", mountinfo=Path("/proc/self/mountinfo").read_text())
    assert isinstance(groups, Unavailable)
    assert groups.reason.startswith(
        "memory and pids controller not enabled in /sys/fs/cgroup/unified/cgroup.controllers; run the container"
    )
    assert not Path("/sys/fs/cgroup/unified/worker").exists()


def test_settings_are_checked() -> None:
    assert open_cgroups("off") == Unavailable("HM_SANDBOX_CGROUP=off")
    with pytest.raises(ValueError, match="HM_SANDBOX_CGROUP: must be auto, off or a cgroup path"):
        open_cgroups("relative/path")
    assert open_cgroups("off", variable="HM_UNIT_CGROUP") == Unavailable("HM_UNIT_CGROUP=off")


@pytest.mark.parametrize("setting", ["/own/../other", "/own/./x", "/..", "/own/.."])
def test_a_path_with_dot_components_is_refused_before_any_comparison(setting: str) -> None:
    """``/own/../other`` starts with ``/own/`` as a string; it is not nested under /own."""
    with pytest.raises(
        ValueError, match=re.escape("HM_UNIT_CGROUP: a cgroup path must not have . or .. components")
    ):
        open_cgroups(setting, variable="HM_UNIT_CGROUP")


def test_platform_setting_on_this_machine_is_v1_auto() -> None:
    setting, said = platform_setting()
    assert setting == "auto"
    assert said.startswith(
        "per-job cgroups: cgroup v1 memory and pids, each worker's jobs under /sys/fs/cgroup/memory/"
    )


def test_platform_setting_never_moves_other_processes_on_v2() -> None:
    """This machine's real unified root group as a v2 host's own group: it holds every process of
    the machine, so ``hypermedia up`` leaves cgroups off rather than move them."""
    setting, said = platform_setting(proc_cgroup="0::/\n", mountinfo=Path("/proc/self/mountinfo").read_text())
    assert setting == "off"
    assert said.startswith("per-job cgroups off (jobs keep RLIMIT_AS): /sys/fs/cgroup/unified holds ")
    assert "will not move" in said
