"""Containment of an execution (seed 001, ADR 0046): every process of it SIGKILLed and reaped
before any of its jobs is handed back, so nothing of a contained execution can still write.

Control is a child subreaper, so a process of execution whose parent died is re-parented to
control: "every process of it" is control's live descendants and the members of execution's
cgroup, where it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

import psutil

from hypermedia.sandbox import cgroups
from hypermedia.worker.unit.channel import Execution

log = logging.getLogger(__name__)

CONTAINMENT_SECONDS = 10.0
"""How long containment keeps SIGKILLing and reaping before it gives up (exit 71): a process in
uninterruptible sleep, or a frozen one, does not die at once."""


class ContainmentFailed(Exception):
    """Something of an execution outlived SIGKILL for :data:`CONTAINMENT_SECONDS`."""


async def contain(ex: Execution, reap: Callable[[], None]) -> None:
    """SIGKILL ``ex`` and every process of it until none is left, calling ``reap`` (control's
    waitpid loop) as they end; then remove execution's cgroup with what its sandbox made in it.

    Raises:
        ContainmentFailed: naming how many processes (and up to 8 pids) outlived the deadline.
    """
    deadline = time.monotonic() + CONTAINMENT_SECONDS
    while victims := unit_processes(ex):
        if time.monotonic() > deadline:
            raise ContainmentFailed(
                f"containment failed: {len(victims)} processes of execution generation "
                f"{ex.identity.generation} outlived SIGKILL for {CONTAINMENT_SECONDS:.0f} s "
                f"(pids {', '.join(map(str, sorted(victims)[:8]))}); its jobs are not handed back"
            )
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap()
        await asyncio.sleep(0.02)
    reap()
    if ex.group is not None:
        # The group holds what execution's sandbox made in it (its base and the job groups):
        # one directory per hierarchy, each the parent of one of its cgroup.procs files.
        for procs in ex.group.procs_files:
            cgroups.remove_tree(os.path.dirname(procs))
        if not ex.group.remove():
            log.warning("execution's cgroup could not be removed yet")
        ex.group = None


def unit_processes(ex: Execution) -> set[int]:
    """Live (not zombie) processes of ``ex``: control's descendants and the members of
    execution's cgroup; never control itself."""
    found: set[int] = set()
    with contextlib.suppress(psutil.Error, OSError):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.add(child.pid)
    if ex.group is not None:
        for procs in ex.group.procs_files:
            with contextlib.suppress(OSError):
                with open(procs) as f:
                    found.update(int(p) for p in f.read().split())
    if not ex.exited.is_set() and ex.exit_code is None:
        with contextlib.suppress(psutil.Error, OSError):
            if psutil.Process(ex.process.pid).status() != psutil.STATUS_ZOMBIE:
                found.add(ex.process.pid)
    found.discard(os.getpid())
    return found
