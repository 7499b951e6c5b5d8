"""The engine contract: what a sandbox entry returns (:class:`OutputFile`), how it reports progress
(:func:`report_progress`) and keeps finished parts beyond its attempt (:func:`keep_part`,
:func:`resumed_part`, :func:`resumed_files`), asks to fan its job out (:func:`fan_out_request`),
the shape every entry has (:class:`Entry`).
Engines import this, never the sandbox; the sandbox and the worker import it to read what
entries give back."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import shutil
import struct
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol


@dataclass(frozen=True)
class OutputFile:
    """One file an entry wrote into its ``output/`` directory.

    Defined here because every worker's entry returns these; ``hypermedia.engines.imaging.ops`` re-exports it.
    """

    output_type: str
    """What the file is: ``thumbnail``, ``resized``, ``compressed``, ``converted``, …"""
    filename: str
    """Plain file name inside the output directory (no directories)."""
    mime_type: str
    """Content type, e.g. ``image/webp``."""
    metadata: dict
    """JSON-safe facts about the file, e.g. ``{"width": 256, "height": 171, "format": "webp"}``."""


JOB_CPU_VARIABLE: Final = "HM_JOB_CPU_SECONDS"
"""The environment variable that gives a sandboxed entry its job's CPU time in seconds (its
``RLIMIT_CPU``, which the kernel counts per process): what an engine running processes of its
own hands them (ADR 0084): :func:`job_cpu_seconds_left`."""


def job_cpu_seconds_left() -> float:
    """CPU seconds the sandboxed job this process runs may still use: its CPU time
    (:data:`JOB_CPU_VARIABLE`, which the sandbox gives its child: the profile's timeout and its
    ``RLIMIT_CPU``) less what this process and the children it waited for used (``getrusage``).
    Infinite outside a sandbox child (no such variable), whatever this process's own limit. The
    sandbox counts a job killed at the wall clock over its processes too (ADR 0084)."""
    budget = os.environ.get(JOB_CPU_VARIABLE)
    if not budget:
        return math.inf
    used = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return float(budget) - sum(usage.ru_utime + usage.ru_stime for usage in used)


PROGRESS_FILE: Final = "progress"
"""File in the job dir where an entry reports how far it is (:func:`report_progress`)."""

_PROGRESS_MIN_INTERVAL: Final = 0.5

_progress_written: dict[str, tuple[float, float]] = {}


def report_progress(out_dir: Path, fraction: float) -> None:
    """Called by an entry, in the sandbox child: reports that ``fraction`` (0–1) of its work is
    done, for the worker to turn into job progress events while the child runs
    (:func:`read_progress`). Writes ``{job_dir}/progress`` (``out_dir``'s parent) as a decimal
    number, atomically (a temporary file renamed over it); at most every 0.5 s, except 1.0.
    Best effort: an ``OSError`` (a full disk) is ignored — progress never fails a job."""
    fraction = min(1.0, max(0.0, float(fraction))) if math.isfinite(fraction) else 0.0
    key = str(out_dir)
    now = time.monotonic()
    last = _progress_written.get(key)
    if (
        last is not None
        and fraction < 1.0
        and (now - last[0] < _PROGRESS_MIN_INTERVAL or fraction <= last[1])
    ):
        return
    _progress_written[key] = (now, fraction)
    job_dir = Path(out_dir).parent
    tmp = job_dir / f".{PROGRESS_FILE}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(f"{fraction:.4f}")
        os.replace(tmp, job_dir / PROGRESS_FILE)


FAN_OUT: Final = "fan_out"
"""The output type of an entry's request to fan out (:func:`fan_out_request`)."""
FAN_OUT_FILE: Final = "fanout.json"


def fan_out_request(out_dir: Path, chunks: list[Any]) -> OutputFile:
    """An entry's request to fan its job out into ``len(chunks)`` chunks (ADR 0081, 0082;
    :mod:`hypermedia.worker.fanout`): the run's only output, ``fan_out`` (``fanout.json``: each
    chunk as JSON, for whoever debugs the job), metadata ``chunks`` = the count. The worker makes
    one child job per chunk but the last (its ``chunk_index`` the chunk's), which the job's next
    run does itself."""
    (out_dir / FAN_OUT_FILE).write_text(json.dumps({"chunks": chunks}))
    return OutputFile(FAN_OUT, FAN_OUT_FILE, "application/json", {"chunks": len(chunks)})


CHECKPOINT_DIR: Final = "checkpoints"
"""Directory in the job dir where an entry that works in parts (``ocr``: pages) keeps each
finished part (:func:`keep_part`) for the worker to store beyond the attempt (ADR 0069)."""
RESUME_DIR: Final = "resume"
"""Directory in the job dir where the worker puts the parts an earlier attempt of the job kept
(``{part}.zip``), for :func:`resumed_part`."""
MAX_PART_BYTES: Final = 64 * 1024 * 1024
"""Largest part the worker keeps, and largest file of a resumed part an entry reads back
(bytes): an OCR page's record, text, hOCR and PDF page are a few MiB at most."""
MAX_RESUMED_PART_BYTES: Final = 2 * MAX_PART_BYTES
"""Most bytes all files of one resumed part may hold once unpacked: what the worker took is at
most :data:`MAX_PART_BYTES` packed, and a part that unpacks to much more is a bomb, not pages."""
_FILE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A file name inside a part that :func:`resumed_files` unpacks: a plain name, never a path."""
_PART_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,11}")
"""A part's name, at most 12 characters: its store key's last segment,
``checkpoint-{job_id}-{part}.zip``, is one output-type segment of at most 64
(:func:`hypermedia.jobs.checkpoints.key_of`)."""


def keep_part(out_dir: Path, part: str, files: Mapping[str, bytes | Path]) -> None:
    """Called by an entry: keeps the finished ``part`` (``page-00012``: lowercase letters,
    digits, ``._-``, at most 12 characters) as ``{job_dir}/checkpoints/{part}.zip`` of ``files``
    (name → bytes, deflated; or name → the path of a file the entry wrote, streamed in stored:
    a transcode's rendition), written under another name and renamed, so the worker only ever
    sees whole parts. Best effort: an ``OSError`` (a full disk) is ignored, the part is then done
    again by a later attempt. Raises ValueError for a bad part name."""
    if not _PART_NAME.fullmatch(part):
        raise ValueError(f"bad part name {part!r}")
    folder = Path(out_dir).parent / CHECKPOINT_DIR
    with contextlib.suppress(OSError):
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{part}.tmp"
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                for name, data in sorted(files.items()):
                    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                    if isinstance(data, bytes):
                        archive.writestr(info, data)
                        continue
                    info.compress_type = zipfile.ZIP_STORED  # encoded media does not deflate
                    with data.open("rb") as source, archive.open(info, "w", force_zip64=True) as target:
                        shutil.copyfileobj(source, target, 1 << 20)
            os.replace(tmp, folder / f"{part}.zip")
        finally:
            tmp.unlink(missing_ok=True)  # a part half written (a full disk) takes no more space


def resumed_part(out_dir: Path, part: str) -> dict[str, bytes] | None:
    """Called by an entry: the files of ``part`` an earlier attempt kept (:func:`keep_part`),
    or None when it has none, or none it can read whole (a file over :data:`MAX_PART_BYTES`,
    more than :data:`MAX_RESUMED_PART_BYTES` in all, a damaged archive, no memory left: the part
    is then done again)."""
    path = Path(out_dir).parent / RESUME_DIR / f"{part}.zip"
    if not _PART_NAME.fullmatch(part) or not path.is_file():
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            sizes = [info.file_size for info in archive.infolist()]
            if any(size > MAX_PART_BYTES for size in sizes) or sum(sizes) > MAX_RESUMED_PART_BYTES:
                return None
            return {info.filename: archive.read(info) for info in archive.infolist()}
    except Exception:  # best effort: a damaged deflate stream raises zlib.error, and so on
        return None


def resumed_parts(out_dir: Path) -> list[str]:
    """Called by an entry: the names of the parts earlier attempts kept that the worker put back
    (:func:`keep_part`; each read with :func:`resumed_part`), in name order; ``[]`` when none."""
    try:
        names = sorted(p.name.removesuffix(".zip") for p in (Path(out_dir).parent / RESUME_DIR).glob("*.zip"))
    except OSError:
        return []
    return [name for name in names if _PART_NAME.fullmatch(name)]


def resumed_files(out_dir: Path, part: str, into: Path, members: Mapping[str, int]) -> dict[str, Path] | None:
    """Called by an entry whose parts hold large files (a transcode's renditions: see
    :func:`keep_part`): unpacks ``part`` into the existing, empty directory ``into``, streamed,
    and returns its files (name → path); ``None``, with nothing left in ``into``, when there is
    no such part or none it can take whole. The part must hold exactly ``members`` (name → most
    bytes unpacked), each stored or deflated and not encrypted; its end record is read first, so
    an archive of a million entries is refused before its directory is parsed. Anything else —
    a damaged or foreign archive, a full disk — is ``None`` too: the part is then done again."""
    path = Path(out_dir).parent / RESUME_DIR / f"{part}.zip"
    if not _PART_NAME.fullmatch(part) or not path.is_file():
        return None
    written: dict[str, Path] = {}
    try:
        if _entries(path) != len(members):
            return None
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if sorted(info.filename for info in infos) != sorted(members) or any(
                info.file_size > members[info.filename]
                or info.flag_bits & 0x1  # encrypted
                or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
                for info in infos
            ):
                return None
            for info in infos:
                unpacked = into / info.filename
                with archive.open(info) as source, unpacked.open("xb") as target:
                    written[info.filename] = unpacked  # created here: removed again on failure
                    shutil.copyfileobj(source, target, 1 << 20)
        return written
    except Exception:  # best effort: whatever a damaged or hostile part raises, it is done again
        for file in written.values():
            file.unlink(missing_ok=True)
        return None


_END_RECORD: Final = struct.Struct("<4s4H2LH")
"""A zip's end of central directory record (APPNOTE 4.3.16): signature, disk numbers, the
entries on this disk and in all, the directory's size and offset, the comment's length."""


def _entries(path: Path) -> int:
    """The number of entries the end record of the zip at ``path`` states (a zip64 archive's
    record states at most 65,535), or -1 without one in its last 64 KiB + 22 bytes."""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 16) - _END_RECORD.size))
        tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _END_RECORD.size:
        return -1
    return int(_END_RECORD.unpack_from(tail, at)[4])


class Entry(Protocol):
    """The shape of a sandbox entry (``"module:function"``, called in the job's child process): runs
    ``operation`` with validated ``params`` on the file at ``input_path`` and writes its outputs into
    the existing directory ``out_dir`` (plain files, no subdirectories), returning one
    :class:`OutputFile` per file written. ``limits`` is the engine's own limits object (pixels,
    pages, durations), passed by keyword. Raises :class:`~hypermedia.core.errors.DomainError` with a
    bounded ``error_code`` for anything the file or params cause; anything else is ``INTERNAL``."""

    def __call__(
        self, operation: str, params: dict, input_path: Path, out_dir: Path, *, limits: Any
    ) -> list[OutputFile]: ...
