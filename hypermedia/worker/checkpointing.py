"""The worker's side of checkpoints (ADR 0069): an earlier attempt's parts put where the entry
finds them, and the parts this attempt finishes recorded and stored while it runs.

Only for handlers that keep parts (:attr:`JobHandler.checkpoints`: the ocrworker's, the
docworker's, the mediaworker's); bounded, because the job's child writes the directory the parts
come from (at most the handler's ``checkpoint_max_parts`` parts, of its ``checkpoint_part_bytes`` each and
``checkpoint_job_bytes`` in all per attempt, opened without following a symlink, hashed and
uploaded streamed, never held in memory whole); best effort: a part that cannot be restored is
done again, a part that cannot be kept is lost with the attempt, and neither fails the job.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import asyncpg
import httpx

from hypermedia.api.storage.v1 import storage_pb2
from hypermedia.engines.contract import CHECKPOINT_DIR, MAX_PART_BYTES, RESUME_DIR
from hypermedia.jobs import checkpoints, lifecycle
from hypermedia.sandbox import open_output
from hypermedia.worker.transfer import GRANT_MARGIN_SECONDS, FileBody, Transfers, send_output, sha256_fd

if TYPE_CHECKING:
    from hypermedia.worker.handler import JobHandler

log = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.25
"""How often the checkpoint directory of a running job is looked at for finished parts."""
MAX_PARTS: Final = 64
"""Parts one attempt keeps, and restores, at most, unless the handler says otherwise
(``JobHandler.checkpoint_max_parts``: the ocrworker's restores the pages of a fanned-out job)."""
MAX_JOB_BYTES: Final = 256 * 1024 * 1024
"""Bytes of parts one attempt keeps, and restores, at most, unless the handler says otherwise
(``JobHandler.checkpoint_job_bytes``)."""
MAX_LISTED: Final = 1_000
"""Entries of a job's checkpoint directory looked at per listing (a job keeps at most its
handler's ``checkpoint_max_parts`` parts; the rest is the child's doing)."""
TRIES: Final = 3
"""Tries to keep one part before it is given up (its page is then done again by a later attempt)."""


class Checkpointing:
    """Restores and keeps one worker's job checkpoints.

    Args:
        transfers: the worker's transfers (grants, downloads).
        http: client for the presigned URLs.
        pool: the system of record (``job_checkpoints``).
        worker_id: the worker's id, the fence of :func:`checkpoints.record` with the attempt.
        enabled: whether the worker's handler keeps parts; without, both methods do nothing.
        part_bytes: largest part kept or restored, in bytes (a larger one is done again).
        job_bytes: most bytes of parts one attempt keeps (each try counted, a failed one too),
            and restores.
        operations: the operations whose jobs keep parts (``None``: every one the handler runs).
        max_parts: most parts one attempt keeps, and restores.
    """

    def __init__(
        self,
        transfers: Transfers,
        http: httpx.AsyncClient,
        pool: asyncpg.Pool,
        worker_id: str,
        enabled: bool,
        *,
        part_bytes: int = MAX_PART_BYTES,
        job_bytes: int = MAX_JOB_BYTES,
        operations: frozenset[str] | None = None,
        max_parts: int = MAX_PARTS,
    ) -> None:
        self._transfers = transfers
        self._http = http
        self._pool = pool
        self._worker_id = worker_id
        self._enabled = enabled
        self._part_bytes = part_bytes
        self._job_bytes = job_bytes
        self._max_parts = max_parts
        self._operations = operations

    @classmethod
    def of(
        cls,
        handler: JobHandler,
        transfers: Transfers,
        http: httpx.AsyncClient,
        pool: asyncpg.Pool,
        worker_id: str,
    ) -> Checkpointing:
        """The checkpointing of a worker whose jobs ``handler`` runs: on when it keeps parts
        (:attr:`JobHandler.checkpoints`) for the operations it names (``checkpoint_operations``),
        within its bounds (``checkpoint_part_bytes``, ``checkpoint_job_bytes``,
        ``checkpoint_max_parts``)."""
        return cls(
            transfers,
            http,
            pool,
            worker_id,
            handler.checkpoints,
            part_bytes=handler.checkpoint_part_bytes,
            job_bytes=handler.checkpoint_job_bytes,
            operations=handler.checkpoint_operations,
            max_parts=handler.checkpoint_max_parts,
        )

    def _keeps(self, job: lifecycle.ClaimedJob) -> bool:
        """Whether ``job`` keeps parts: its handler's do, for its operation."""
        return self._enabled and (self._operations is None or job.operation in self._operations)

    async def restore(
        self, job: lifecycle.ClaimedJob, granted: storage_pb2.GrantJobResponse, job_dir: Path
    ) -> int:
        """Downloads the parts earlier attempts of ``job`` kept (``granted.checkpoints``, at most
        ``max_parts``, each at most ``part_bytes`` and ``job_bytes`` in all) into
        ``{job_dir}/resume/``, readable by the job's child; returns how many. A part that cannot
        be downloaded, or whose bytes are not the ones its row records (SHA-256: changed in the
        store, or an upload that never finished), is left out (the entry does it again)."""
        if not self._keeps(job) or not granted.checkpoints:
            return 0
        recorded = {c.part: c.sha256 for c in await checkpoints.of_job(self._pool, job.job_id)}
        folder = job_dir / RESUME_DIR
        folder.mkdir(mode=0o755, exist_ok=True)
        restored, budget = 0, self._job_bytes
        for part, url in sorted(granted.checkpoints.items())[: self._max_parts]:
            if not checkpoints.PART.fullmatch(part) or part not in recorded or budget <= 0:
                continue
            dest = folder / f"{part}.zip"
            try:
                await self._transfers.download(url, dest, min(self._part_bytes, budget))
                digest = await asyncio.to_thread(_sha256, dest)
            except Exception:
                log.warning("checkpoint %s not restored", part, exc_info=True, extra={"job_id": job.job_id})
                dest.unlink(missing_ok=True)
                continue
            if digest != recorded[part]:
                log.warning(
                    "checkpoint %s not restored: its bytes are not the recorded ones",
                    part,
                    extra={"job_id": job.job_id},
                )
                dest.unlink(missing_ok=True)
                continue
            dest.chmod(0o644)
            budget -= dest.stat().st_size
            restored += 1
        log.info("resuming after %d kept parts", restored, extra={"job_id": job.job_id})
        return restored

    async def keep(
        self,
        job: lifecycle.ClaimedJob,
        granted: storage_pb2.GrantJobResponse,
        job_dir: Path,
        finished: asyncio.Event,
    ) -> None:
        """Until ``finished`` and once more after it: every :data:`POLL_SECONDS`, each part the
        entry finished (``{job_dir}/checkpoints/{part}.zip``) is recorded with this attempt and
        uploaded under the job's prefix; a part that fails :data:`TRIES` times is given up.
        Never raises."""
        if not self._keeps(job):
            return
        folder = job_dir / CHECKPOINT_DIR
        grant = granted.outputs
        settled: set[str] = set()
        failures: dict[str, int] = {}
        budget = _Budget(self._job_bytes)
        while True:
            done = finished.is_set()
            names = await asyncio.to_thread(_finished_parts, folder)
            for name in names:
                part = name.removesuffix(".zip")
                if part in settled or len(settled) >= self._max_parts or not checkpoints.PART.fullmatch(part):
                    continue
                try:
                    if grant.expires_at.ToSeconds() - time.time() < GRANT_MARGIN_SECONDS:
                        grant = (await self._transfers.grant(job)).outputs
                    await self._keep_one(job, grant, job_dir, part, budget)
                    settled.add(part)
                except Exception:
                    failures[part] = failures.get(part, 0) + 1
                    if failures[part] >= TRIES:
                        settled.add(part)
                    log.warning("checkpoint %s not kept", part, exc_info=True, extra={"job_id": job.job_id})
            if done:
                return
            try:
                await asyncio.wait_for(finished.wait(), POLL_SECONDS)
            except TimeoutError:
                pass

    async def _keep_one(
        self,
        job: lifecycle.ClaimedJob,
        grant: storage_pb2.OutputGrant,
        job_dir: Path,
        part: str,
        budget: _Budget,
    ) -> None:
        """Records one finished part (fenced by the attempt), then uploads it. A part recorded
        by a fenced attempt is not uploaded at all, so nothing is stored that no row names. The
        part is opened once (no symlink followed, a regular singly linked file), its size taken
        from ``budget`` before it is read (refused over ``part_bytes``, over the largest upload
        the grant accepts — storage's ``HM_STORAGE_MAX_PUT_BYTES`` — or over what is left: a child
        that makes every try fail cannot have the worker hash more than the attempt's bytes),
        hashed and uploaded from that descriptor in blocks; bytes the child changed after the
        hash are refused by the store, which checks the SHA-256 as it writes."""
        fd, size = await asyncio.to_thread(open_output, job_dir, f"{part}.zip", CHECKPOINT_DIR)
        try:
            budget.take(part, size, min(self._part_bytes, grant.max_bytes or self._part_bytes))
            digest = await asyncio.to_thread(sha256_fd, fd, size)
            key = checkpoints.key_of(grant.key_prefix, checkpoints.owner_of(job), part)
            checkpoint = checkpoints.Checkpoint(part, key, size, digest, job.attempt)
            if not await checkpoints.record(self._pool, job, self._worker_id, checkpoint):
                log.info("checkpoint %s not kept: the attempt is fenced", part, extra={"job_id": job.job_id})
                return
            response = await send_output(
                self._http, grant, key, FileBody(fd, size), "application/zip", digest
            )
        finally:
            os.close(fd)
        if response.status_code >= 300:
            raise OSError(f"storage answered {response.status_code} to checkpoint {part}")


@dataclass
class _Budget:
    """Bytes of parts an attempt may still read: each try takes its part's size, kept or not."""

    left: int

    def take(self, part: str, size: int, part_bytes: int) -> None:
        """Takes ``size`` bytes. Raises OSError ``EFBIG`` over ``part_bytes`` or what is left."""
        if size > min(part_bytes, self.left):
            raise OSError(errno.EFBIG, f"part {part} is {size} bytes, over {min(part_bytes, self.left)}")
        self.left -= size


def _finished_parts(folder: Path) -> list[str]:
    """The ``*.zip`` names in the job's checkpoint directory, sorted; off the event loop, and at
    most :data:`MAX_LISTED` entries looked at: the job's child writes the directory, and a child
    that filled it with names must not stall the worker's other jobs with the listing."""
    names = []
    try:
        with os.scandir(folder) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_LISTED:
                    break
                if entry.name.endswith(".zip"):
                    names.append(entry.name)
    except OSError:  # not there yet, or not a directory
        return []
    return sorted(names)


def _sha256(path: Path) -> str:
    """The SHA-256 (hex) of the file at ``path`` (:func:`sha256_fd`, as parts are hashed when kept)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return sha256_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
