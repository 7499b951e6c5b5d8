"""Landlock (Linux 5.13+): a process restricts which files it, and everything it later executes,
may open, by path hierarchy, without root. Used by :func:`hypermedia.sandbox.confined_exec_main`
to give a LibreOffice listener a filesystem view of its own program, fonts, profile and job files
only (docs/adr/0027), so that a document that makes LibreOffice load a host file finds nothing to
read even when :mod:`hypermedia.engines.documents.links` misses the reference.

The three system calls are made through ``ctypes`` (their numbers are the same on x86_64 and
aarch64: the generic syscall table). The only Python binding on PyPI (``landlock``) is a
development pre-release; the kernel ABI is a stable interface of a few structs
(``include/uapi/linux/landlock.h``, https://docs.kernel.org/userspace-api/landlock.html).

A ruleset handles every filesystem right the running kernel knows (ABI 1–3, 5), all TCP binds
and connects (ABI 4) and, from ABI 6, scopes abstract Unix sockets and signals to the domain (the
listener cannot signal the worker nor reach an abstract socket outside it); what no rule grants
is refused with ``EACCES``. ``stat`` and ``access`` are not restricted by Landlock (so a file's
existence may show; its content does not).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "READ",
    "READ_EXECUTE",
    "READ_WRITE",
    "LandlockUnavailable",
    "Rule",
    "abi_version",
    "restrict_self",
]

_SYSCALLS: Final = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}

# include/uapi/linux/landlock.h
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

_FS_BY_ABI: Final = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS: Final = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights a rule on a file (not a directory) may carry; the kernel refuses others."""

READ: Final = READ_FILE | READ_DIR
"""Read files and list directories."""
READ_EXECUTE: Final = READ | EXECUTE
"""Also execute (and ``mmap`` with ``PROT_EXEC``) files: programs and libraries."""
READ_WRITE: Final = (
    READ_EXECUTE
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
"""Everything a private working directory needs (no device nodes, no device ioctls)."""


class LandlockUnavailable(OSError):
    """The kernel has no Landlock (older than 5.13, or not in the ``lsm=`` list), or this machine's
    architecture is not one whose syscall numbers are known here."""


@dataclass(frozen=True)
class Rule:
    """``access`` (a mask of this module's rights, e.g. :data:`READ`) granted on ``path`` and,
    for a directory, everything beneath it. Symlinks are followed: the rule is on the target."""

    path: str
    access: int


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _numbers() -> tuple[int, int, int]:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise LandlockUnavailable(errno.ENOSYS, f"Landlock syscall numbers unknown on {platform.machine()}")
    return numbers


def abi_version() -> int:
    """The kernel's Landlock ABI version (1 on Linux 5.13, 7 on 6.15), or 0 when it has none
    (``ENOSYS``: not built, ``EOPNOTSUPP``: built but disabled at boot) or the architecture is not
    known here."""
    try:
        create, _add, _restrict = _numbers()
    except LandlockUnavailable:
        return 0
    version = _libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(version) if version > 0 else 0


def _ruleset_attr(abi: int) -> bytes:
    """``struct landlock_ruleset_attr`` cut to the fields ``abi`` knows (the kernel refuses
    unknown non-zero fields): ``handled_access_fs``, ``handled_access_net`` (4+), ``scoped`` (6+)."""
    fs = _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= abi)]
    if abi < 4:
        return struct.pack("=Q", fs)
    if abi < 6:
        return struct.pack("=QQ", fs, _NET_BIND_TCP | _NET_CONNECT_TCP)
    return struct.pack(
        "=QQQ", fs, _NET_BIND_TCP | _NET_CONNECT_TCP, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    )


def restrict_self(rules: Iterable[Rule]) -> int:
    """Confines this process (and whatever it executes afterwards) to ``rules``: every other file
    open, directory listing, file creation or removal, execution, TCP bind or connect is refused
    (``EACCES``), as are signals and abstract Unix sockets out of the domain. Irreversible. A rule
    whose path does not exist is skipped. Needs ``no_new_privs`` (or CAP_SYS_ADMIN) set first.

    Returns:
        The ABI version the ruleset was made for.

    Raises:
        LandlockUnavailable: the kernel has no Landlock (see :func:`abi_version`).
        OSError: a system call failed (its errno).
    """
    abi = abi_version()
    if abi == 0:
        raise LandlockUnavailable(errno.EOPNOTSUPP, "the kernel has no Landlock")
    create, add, restrict = _numbers()
    attr = _ruleset_attr(abi)
    handled = struct.unpack_from("=Q", attr)[0]
    ruleset = _libc.syscall(create, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for rule in rules:
            try:
                fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                access = rule.access & handled
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= _FILE_RIGHTS
                beneath = struct.pack("=Qi", access, fd)  # packed struct landlock_path_beneath_attr
                if (
                    _libc.syscall(add, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), beneath, 0)
                    != 0
                ):
                    raise _error(f"landlock_add_rule {rule.path}")
            finally:
                os.close(fd)
        if _libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _error(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call}: {os.strerror(err)}")
