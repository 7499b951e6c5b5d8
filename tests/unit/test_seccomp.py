"""The job children's seccomp filter (hypermedia.sandbox.seccomp), loaded for real in forked
children of this test process."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import struct
import threading

import pytest

from hypermedia.sandbox import seccomp
from hypermedia.sandbox.confine import _PR_SET_NO_NEW_PRIVS, _prctl


def _in_filtered_child(probe: str) -> tuple[int, dict]:
    """Forks, sets no_new_privs, loads the filter and runs ``probe`` (a name below); returns the
    wait status and what the probe wrote (JSON) before it ended."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)
            seccomp.install()
            facts = PROBES[probe]()
            os.write(w, json.dumps(facts).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return status, json.loads(data or b"{}")


def _errno_of(call) -> str:
    try:
        call()
    except OSError as exc:
        return errno.errorcode[exc.errno or 0]
    return "ok"


def _refusals() -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    facts = {
        "inet": _errno_of(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
        "netlink": _errno_of(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()),
        "unix": _errno_of(lambda: socket.socketpair(socket.AF_UNIX).__iter__().__next__().close()),
        "unshare": "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()],
        "mount": "ok"
        if libc.mount(b"none", b"/", b"tmpfs", 0, None) == 0
        else errno.errorcode[ctypes.get_errno()],
    }
    # A thread (glibc tries clone3 first: ENOSYS, then clone without CLONE_NEW*) and a fork.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(threading.get_native_id()))
    thread.start()
    thread.join()
    facts["thread"] = len(seen)
    child = os.fork()
    if child == 0:
        os._exit(7)
    facts["fork_exit"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    return facts


def _ptrace() -> dict:
    ctypes.CDLL(None, use_errno=True).ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH
    return {"survived": True}


def _bpf() -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(seccomp._TABLES[os.uname().machine].numbers["bpf"], 0, None, 0)
    return {"survived": True}


PROBES = {"refusals": _refusals, "ptrace": _ptrace, "bpf": _bpf}


def test_refused_calls_fail_with_their_errno_and_threads_and_forks_still_work() -> None:
    status, facts = _in_filtered_child("refusals")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert facts == {
        "inet": "EAFNOSUPPORT",
        "netlink": "EAFNOSUPPORT",
        "unix": "ok",
        "unshare": "EPERM",
        "mount": "EPERM",
        "thread": 1,
        "fork_exit": 7,
    }


@pytest.mark.parametrize("probe", ["ptrace", "bpf"])
def test_killed_calls_end_the_process_with_sigsys(probe: str) -> None:
    status, facts = _in_filtered_child(probe)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS
    assert facts == {}


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", 0xC000003E), ("aarch64", 0xC00000B7)])
def test_the_program_checks_the_architecture_first(machine: str, arch: int) -> None:
    program = seccomp.filter_program(machine)
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    assert insns[0] == (0x20, 0, 0, 4)  # ld [4]: seccomp_data.arch
    assert insns[1] == (0x15, 1, 0, arch)  # jeq AUDIT_ARCH_*: skip the kill
    assert insns[2] == (0x06, 0, 0, seccomp.SECCOMP_RET_KILL_PROCESS)
    assert insns[-1] == (0x06, 0, 0, seccomp.SECCOMP_RET_ALLOW)
    assert len(insns) < 256  # BPF_MAXINSNS is 4096; a linear filter this short costs little
    # x86_64 refuses x32 numbers (nr >= 0x40000000) right after loading nr.
    assert (insns[4] == (0x35, 0, 1, 0x40000000)) == (machine == "x86_64")


def test_an_unknown_architecture_is_refused_with_a_clear_error() -> None:
    with pytest.raises(seccomp.SeccompUnavailable, match="no seccomp syscall table for riscv64"):
        seccomp.filter_program("riscv64")
