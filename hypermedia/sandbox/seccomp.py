"""A seccomp filter for job children: a classic-BPF program, built here, that the kernel runs on
every system call of the job (and of everything it forks or executes afterwards).

What it refuses, and how (the same choices as Docker's default profile and Chromium's sandbox):

* **kill the process** (``SECCOMP_RET_KILL_PROCESS``, the job dies of ``SIGSYS``, the worker
  reports ``SANDBOX_VIOLATION``): calls no media engine makes and an escape starts with —
  ``ptrace``, ``process_vm_readv``/``writev``, ``kexec_load``/``kexec_file_load``,
  ``init_module``/``finit_module``/``delete_module``, ``bpf``; also any call made with another
  architecture's numbering (a 32-bit ``int 0x80`` on x86_64) or an x32 number.
* **fail with EPERM**: ``keyctl``/``add_key``/``request_key``, ``perf_event_open``,
  ``userfaultfd``, the mount family (``mount``, ``umount2``, ``pivot_root``, ``move_mount``,
  ``open_tree``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``), ``setns``,
  ``unshare``, ``clone`` with any ``CLONE_NEW*`` flag, ``io_uring_setup``/``enter``/``register``.
* **fail with ENOSYS**: ``clone3`` (its flags sit in a struct a filter cannot read; glibc then
  falls back to ``clone``, whose flags it can).
* **fail with EAFNOSUPPORT**: ``socket``/``socketpair`` of any domain but ``AF_UNIX``.

Everything else is allowed. Constants: ``include/uapi/linux/seccomp.h`` (return values,
``struct seccomp_data``), ``include/uapi/linux/filter.h`` and ``bpf_common.h`` (instruction
encoding), ``include/uapi/linux/audit.h`` (``AUDIT_ARCH_*``), ``include/uapi/linux/sched.h``
(``CLONE_NEW*``); syscall numbers from ``arch/x86/entry/syscalls/syscall_64.tbl`` and
``include/uapi/asm-generic/unistd.h`` (aarch64). The clone flags are argument 0 on both
(aarch64 is ``CLONE_BACKWARDS``: only the tls/child_tid order differs). See seccomp(2).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["SeccompUnavailable", "filter_program", "install"]

# include/uapi/linux/bpf_common.h
_BPF_LD, _BPF_JMP, _BPF_RET = 0x00, 0x05, 0x06
_BPF_W, _BPF_ABS, _BPF_K = 0x00, 0x20, 0x00
_BPF_JEQ, _BPF_JGE, _BPF_JSET = 0x10, 0x30, 0x40

# include/uapi/linux/seccomp.h
SECCOMP_RET_KILL_PROCESS: Final = 0x80000000
SECCOMP_RET_ERRNO: Final = 0x00050000
SECCOMP_RET_ALLOW: Final = 0x7FFF0000
_SECCOMP_MODE_FILTER = 2
_PR_SET_SECCOMP = 22  # include/uapi/linux/prctl.h
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0_LOW = 0, 4, 16  # struct seccomp_data, little endian

# include/uapi/linux/audit.h: EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_X86_64: Final = 0xC000003E
AUDIT_ARCH_AARCH64: Final = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000  # arch/x86/include/uapi/asm/unistd.h

CLONE_NEW_FLAGS: Final = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)
"""``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET``
(``CLONE_NEWTIME``, 0x80, exists for ``unshare``/``clone3`` only: in ``clone`` it is part of
the exit signal)."""

_AF_UNIX = 1


@dataclass(frozen=True)
class _Table:
    arch: int
    numbers: Mapping[str, int]
    x32_bit: bool


_TABLES: Final = {
    "x86_64": _Table(
        AUDIT_ARCH_X86_64,
        {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
            "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
            "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249, "perf_event_open": 298,
            "userfaultfd": 323, "mount": 165, "umount2": 166, "pivot_root": 155, "move_mount": 429,
            "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "mount_setattr": 442, "setns": 308, "unshare": 272, "clone": 56, "clone3": 435,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "socket": 41,
            "socketpair": 53,
        },
        x32_bit=True,
    ),
    "aarch64": _Table(
        AUDIT_ARCH_AARCH64,
        {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104,
            "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
            "bpf": 280, "keyctl": 219, "add_key": 217, "request_key": 218, "perf_event_open": 241,
            "userfaultfd": 282, "mount": 40, "umount2": 39, "pivot_root": 41, "move_mount": 429,
            "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "mount_setattr": 442, "setns": 268, "unshare": 97, "clone": 220, "clone3": 435,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "socket": 198,
            "socketpair": 199,
        },
        x32_bit=False,
    ),
}  # fmt: skip
_TABLES["arm64"] = _TABLES["aarch64"]

KILLED: Final = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "bpf",
)  # fmt: skip
"""System calls that kill the job (``SIGSYS``)."""

REFUSED: Final = (
    "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd", "mount", "umount2",
    "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "setns", "unshare", "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip
"""System calls that fail with ``EPERM``."""


class SeccompUnavailable(OSError):
    """This machine's architecture has no syscall table here, or the kernel refused the filter."""


def _stmt(code: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _stmt(_BPF_RET | _BPF_K, value)


def filter_program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (``platform.machine()`` by default): ``struct sock_filter``
    instructions (8 bytes each), in order. Raises SeccompUnavailable for an architecture without a
    table here (x86_64 and aarch64 have one)."""
    machine = machine or platform.machine()
    table = _TABLES.get(machine)
    if table is None:
        raise SeccompUnavailable(errno.ENOSYS, f"no seccomp syscall table for {machine}")
    nr = table.numbers
    load_nr = _stmt(_BPF_LD | _BPF_W | _BPF_ABS, _OFFSET_NR)
    load_arg0 = _stmt(_BPF_LD | _BPF_W | _BPF_ABS, _OFFSET_ARG0_LOW)
    kill = _ret(SECCOMP_RET_KILL_PROCESS)
    prog = [
        _stmt(_BPF_LD | _BPF_W | _BPF_ABS, _OFFSET_ARCH),
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, table.arch, 1, 0),
        kill,
        load_nr,
    ]
    if table.x32_bit:
        prog += [_jump(_BPF_JMP | _BPF_JGE | _BPF_K, _X32_SYSCALL_BIT, 0, 1), kill]
    for name in KILLED:
        prog += [_jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr[name], 0, 1), kill]
    for name in REFUSED:
        prog += [_jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr[name], 0, 1), _ret(SECCOMP_RET_ERRNO | errno.EPERM)]
    prog += [
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr["clone3"], 0, 1),
        _ret(SECCOMP_RET_ERRNO | errno.ENOSYS),
        # clone: refused when arg0 (flags, low 32 bits) has a CLONE_NEW* bit.
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr["clone"], 0, 4),
        load_arg0,
        _jump(_BPF_JMP | _BPF_JSET | _BPF_K, CLONE_NEW_FLAGS, 0, 1),
        _ret(SECCOMP_RET_ERRNO | errno.EPERM),
        _ret(SECCOMP_RET_ALLOW),
        # socket, socketpair: only AF_UNIX (arg0, the domain, an int).
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr["socket"], 1, 0),
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, nr["socketpair"], 0, 4),
        load_arg0,
        _jump(_BPF_JMP | _BPF_JEQ | _BPF_K, _AF_UNIX, 1, 0),
        _ret(SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT),
        _ret(SECCOMP_RET_ALLOW),
        _ret(SECCOMP_RET_ALLOW),
    ]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


_libc = ctypes.CDLL(None, use_errno=True)


def install(program: bytes | None = None) -> None:
    """Loads ``program`` (:func:`filter_program` by default) for this thread with
    ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``; irreversible, inherited by children. Call it
    in a single-threaded process (a forked child), after ``no_new_privs`` (else the kernel wants
    CAP_SYS_ADMIN). Raises SeccompUnavailable when there is no table or the kernel refuses
    (``EINVAL``: no CONFIG_SECCOMP_FILTER; ``EACCES``: no ``no_new_privs``)."""
    program = filter_program() if program is None else program
    fprog = _SockFprog(len(program) // 8, program)
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(err, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(err, err)}")
