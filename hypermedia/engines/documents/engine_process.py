"""Run a document engine call in a process of its own, inside the sandboxed job, and turn a native
death into a specific error.

Why: PDFium does not fail an allocation it cannot make; it ends the process (``abort()``). Measured
with the attack corpus' flate bomb (a content stream that inflates to 1 GiB): under the sandbox's
2 GiB ``RLIMIT_AS``, loading its page dies of SIGABRT at about 1,080 MiB resident (the next buffer
cannot be mapped). Run directly in the sandbox child, that is a death without a report, which the
sandbox can only call ``SANDBOX_CRASHED``. Here the sandbox child forks once more and waits: it
sees the engine's signal and peak memory (``wait4``) and raises what the sandbox maps to a
specific code.

| the engine process | raised in the sandbox child | job ``error_code`` |
|---|---|---|
| returned | its return value | – |
| raised a ``DomainError`` | the same code, message and retryability | that code |
| raised ``MemoryError`` / ``OSError(EFBIG)`` | the same | ``RESOURCE_LIMIT`` |
| died of SIGXCPU (``RLIMIT_CPU``, inherited) | ``CpuTimeExceeded`` | ``TIMEOUT`` (retried; charged as the input's) |
| died of SIGXFSZ | ``OSError(EFBIG)`` | ``RESOURCE_LIMIT`` |
| died of SIGABRT, SIGSEGV, SIGBUS, SIGILL or SIGTRAP with a peak RSS of at least :data:`MEMORY_ABORT_FRACTION` of ``RLIMIT_AS`` | ``MemoryError`` | ``RESOURCE_LIMIT`` |
| died of any other signal | the sandbox child kills itself with that signal | ``SANDBOX_CRASHED`` (as without this module) |
| raised anything else, or exited without a result | ``RuntimeError`` with the engine's traceback (logged by the worker) | ``INTERNAL`` |

The engine process inherits the child's rlimits, uid, namespaces, process group (so the worker's
wall-clock kill and cancellation reach it) and gets SIGKILL if the child dies first. A fork of the
warm child costs about a millisecond. The result crosses a pipe as JSON (at most
:data:`MAX_RESULT_BYTES`), never as a pickle.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import traceback
from collections.abc import Callable
from typing import Any, Final

from hypermedia.core.errors import CpuTimeExceeded, DomainError, PermanentJobError, TransientError

__all__ = ["MAX_RESULT_BYTES", "MEMORY_ABORT_FRACTION", "EngineFailure", "call"]

MAX_RESULT_BYTES: Final = 1 << 20
"""Largest JSON result the engine process may send (the sandbox's own report limit)."""

MEMORY_ABORT_FRACTION: Final = 0.25
"""An abort-like death counts as running out of memory when the engine's peak resident set was at
least this share of its ``RLIMIT_AS``. Buffers grow geometrically, so the allocation that fails
is at least as large as what is resident: at the moment of failure the resident set is well above
a quarter of the limit (measured: 53 % for the flate bomb). An ordinary crash of a small document
stays far below it."""

_ABORT_SIGNALS: Final = frozenset(
    {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGTRAP}
)
_PR_SET_PDEATHSIG: Final = 1
_libc = ctypes.CDLL(None, use_errno=True)


class EngineFailure(RuntimeError):
    """The engine process raised an unexpected exception or ended without a result; the message
    carries its traceback or exit status (for the worker's log, never for the caller)."""


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked engine process; returns its (JSON-safe) result.

    Call only where forking is safe: the sandbox child, before it has started threads (PDFium
    starts none; libvips must not have run an operation in this process).

    Raises:
        DomainError: what ``fn`` raised (rebuilt with its code, public message and retryability;
            a ``CpuTimeExceeded`` as itself), or ``CpuTimeExceeded`` when the engine hit ``RLIMIT_CPU``.
        MemoryError: the engine raised it, or aborted near its memory limit (see the module table).
        OSError: ``EFBIG``, the file size limit.
        EngineFailure: anything else.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the engine process
        os.close(read_fd)
        _engine_main(write_fd, fn, args)
    os.close(write_fd)
    chunks: list[bytes] = []
    size = 0
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(1 << 16):
            size += len(chunk)
            if size <= MAX_RESULT_BYTES:
                chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    if size > MAX_RESULT_BYTES:
        raise EngineFailure(f"engine result larger than {MAX_RESULT_BYTES} bytes")
    if os.WIFSIGNALED(status):
        _raise_for_signal(os.WTERMSIG(status), usage.ru_maxrss * 1024)
    try:
        report = json.loads(b"".join(chunks))
    except ValueError:
        raise EngineFailure(f"engine process exited with status {status} without a result") from None
    return _unpack(report)


def _engine_main(write_fd: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Runs in the engine process; never returns."""
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        report: dict[str, Any] = {"ok": True, "value": fn(*args)}
    except CpuTimeExceeded:
        report = {"ok": False, "kind": "cpu_time"}
    except DomainError as exc:
        report = {
            "ok": False,
            "kind": "domain",
            "error_code": exc.error_code,
            "message": exc.public_message,
            "retryable": exc.retryable,
        }
    except MemoryError:
        report = {"ok": False, "kind": "memory"}
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            report = {"ok": False, "kind": "fsize"}
        else:
            report = {"ok": False, "kind": "internal", "traceback": traceback.format_exc()}
    except BaseException:
        report = {"ok": False, "kind": "internal", "traceback": traceback.format_exc()}
    try:
        data = json.dumps(report, allow_nan=False).encode()
    except (TypeError, ValueError):
        data = json.dumps({"ok": False, "kind": "internal", "traceback": traceback.format_exc()}).encode()
    try:
        while data:
            data = data[os.write(write_fd, data) :]
    finally:
        os._exit(0)


def _raise_for_signal(signum: int, peak_bytes: int) -> None:
    if signum == signal.SIGXCPU:
        raise CpuTimeExceeded()
    if signum == signal.SIGXFSZ:
        raise OSError(errno.EFBIG, "the engine exceeded the file size limit")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if signum in _ABORT_SIGNALS and limit != resource.RLIM_INFINITY:
        if peak_bytes >= limit * MEMORY_ABORT_FRACTION:
            raise MemoryError(f"the engine aborted at {peak_bytes >> 20} MiB resident")
    # Any other death: die the same way, so the sandbox reports it as it would have anyway.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise EngineFailure(f"engine process killed by signal {signum}")  # when the signal is ignored


def _unpack(report: Any) -> Any:
    if not isinstance(report, dict):
        raise EngineFailure("engine result is not an object")
    if report.get("ok") is True:
        return report.get("value")
    kind = report.get("kind")
    if kind == "domain":
        cls = TransientError if report.get("retryable") else PermanentJobError
        raise cls(str(report.get("message") or "processing failed"), str(report.get("error_code")))
    if kind == "cpu_time":
        raise CpuTimeExceeded()
    if kind == "memory":
        raise MemoryError("the engine ran out of memory")
    if kind == "fsize":
        raise OSError(errno.EFBIG, "the engine exceeded the file size limit")
    raise EngineFailure(f"engine process failed:\n{report.get('traceback', '')}")
