"""Reading what a job left in its directory, without trusting it: its outputs (:func:`read_output`,
opened without following a symlink at any step) and its last progress report (:func:`read_progress`).
The worker (and the docworker's listener pool) call these; the files are written by hostile code."""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path

from hypermedia.engines.contract import PROGRESS_FILE


def read_progress(job_dir: Path) -> float | None:
    """The fraction an entry last reported with :func:`report_progress` (0–1), or ``None`` when
    it reported nothing readable. The file is written by the job, so it is opened without
    following a symlink and without blocking (a FIFO), read only if it is a regular file, at most
    32 bytes, and parsed as a finite number in 0–1; anything else is ``None``."""
    try:
        fd = os.open(job_dir / PROGRESS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, 32)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = float(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def read_output(
    job_dir: Path,
    filename: str,
    *,
    max_bytes: int = 1 << 40,
    subdir: str = "output",
    refuse_over: int | None = None,
) -> bytes:
    """The bytes of ``{job_dir}/output/{filename}``, opened without following a symlink at any
    step (the job dir, ``output/`` and the file are each opened with ``O_NOFOLLOW`` relative to
    the previous one), and only if it is a regular file with a single link. A job that replaced
    ``output/`` or its file with a symlink, or hard-linked something in, gets an error, never the
    bytes of a file elsewhere (the worker reading outputs may have more rights than the job).

    Args:
        max_bytes: read at most this many bytes.
        subdir: the job dir's directory to read from instead of ``output/`` (``checkpoints/``).
        refuse_over: a file larger than this many bytes is refused (``EFBIG``) before any is read.

    Raises:
        OSError: see :func:`open_output`.
    """
    fd, size = open_output(job_dir, filename, subdir)
    try:
        if refuse_over is not None and size > refuse_over:
            raise OSError(errno.EFBIG, f"larger than {refuse_over} bytes")
        chunks = []
        remaining = min(max_bytes, size)
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_output(job_dir: Path, filename: str, subdir: str = "output") -> tuple[int, int]:
    """``(fd, size in bytes)`` of ``{job_dir}/output/{filename}``: a read-only fd, opened as
    :func:`read_output` describes and checked to be a regular, singly linked file; the caller
    closes it.

    Raises:
        OSError: ``ELOOP`` for a symlink, ``ENOTDIR``, ``ENOENT``, or ``EPERM`` when the file is not
            a regular, singly linked file.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(job_dir, flags | os.O_DIRECTORY)
    try:
        out_fd = os.open(subdir, flags | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            fd = os.open(filename, flags | os.O_NONBLOCK, dir_fd=out_fd)
        finally:
            os.close(out_fd)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular, singly linked file")
    except OSError:
        os.close(fd)
        raise
    return fd, info.st_size
