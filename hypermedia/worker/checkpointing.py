"""The worker's side of checkpoints (ADR 0069): an earlier attempt's parts put where the entry
finds them, and the parts this attempt finishes stored and recorded while it runs.

Both are best effort: a part that cannot be restored is done again, a part that cannot be kept
is lost with the attempt, and neither ever fails the job.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Final

import asyncpg
import httpx

from hypermedia.api.storage.v1 import storage_pb2
from hypermedia.engines.contract import CHECKPOINT_DIR, MAX_PART_BYTES, RESUME_DIR
from hypermedia.jobs import checkpoints, lifecycle
from hypermedia.sandbox import read_output
from hypermedia.worker.transfer import GRANT_MARGIN_SECONDS, Transfers, send_output

log = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.25
"""How often the checkpoint directory of a running job is looked at for finished parts."""


class Checkpointing:
    """Restores and keeps one worker's job checkpoints.

    Args:
        transfers: the worker's transfers (grants, downloads).
        http: client for the presigned URLs.
        pool: the system of record (``job_checkpoints``).
        worker_id: the worker's id, the fence of :func:`checkpoints.record` with the attempt.
    """

    def __init__(
        self, transfers: Transfers, http: httpx.AsyncClient, pool: asyncpg.Pool, worker_id: str
    ) -> None:
        self._transfers = transfers
        self._http = http
        self._pool = pool
        self._worker_id = worker_id

    async def restore(
        self, job: lifecycle.ClaimedJob, granted: storage_pb2.GrantJobResponse, job_dir: Path
    ) -> int:
        """Downloads the parts earlier attempts of ``job`` kept (``granted.checkpoints``) into
        ``{job_dir}/resume/``, readable by the job's child; returns how many. A part that cannot
        be downloaded is left out (the entry does it again)."""
        if not granted.checkpoints:
            return 0
        folder = job_dir / RESUME_DIR
        folder.mkdir(mode=0o755, exist_ok=True)
        restored = 0
        for part, url in sorted(granted.checkpoints.items()):
            if not checkpoints.PART.fullmatch(part):
                continue
            dest = folder / f"{part}.zip"
            try:
                await self._transfers.download(url, dest, MAX_PART_BYTES)
            except Exception:
                log.warning("checkpoint %s not restored", part, exc_info=True, extra={"job_id": job.job_id})
                dest.unlink(missing_ok=True)
                continue
            dest.chmod(0o644)
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
        entry finished (``{job_dir}/checkpoints/{part}.zip``) is uploaded under the job's prefix
        and recorded with this attempt. Never raises."""
        folder = job_dir / CHECKPOINT_DIR
        grant = granted.outputs
        kept: set[str] = set()
        while True:
            done = finished.is_set()
            try:
                for path in sorted(folder.glob("*.zip")) if folder.is_dir() else []:
                    part = path.name.removesuffix(".zip")
                    if part in kept or not checkpoints.PART.fullmatch(part):
                        continue
                    if grant.expires_at.ToSeconds() - time.time() < GRANT_MARGIN_SECONDS:
                        grant = (await self._transfers.grant(job)).outputs
                    await self._keep_one(job, grant, path, part)
                    kept.add(part)
            except Exception:
                log.warning("checkpoint not kept", exc_info=True, extra={"job_id": job.job_id})
            if done:
                return
            try:
                await asyncio.wait_for(finished.wait(), POLL_SECONDS)
            except TimeoutError:
                pass

    async def _keep_one(
        self, job: lifecycle.ClaimedJob, grant: storage_pb2.OutputGrant, path: Path, part: str
    ) -> None:
        """Uploads one finished part and records it (fenced by the attempt)."""
        data = await asyncio.to_thread(_read_part, path.parent.parent, path.name)
        digest = hashlib.sha256(data).hexdigest()
        key = checkpoints.key_of(grant.key_prefix, job.job_id, part)
        response = await send_output(self._http, grant, key, data, "application/zip", digest)
        if response.status_code >= 300:
            raise OSError(f"storage answered {response.status_code} to checkpoint {part}")
        checkpoint = checkpoints.Checkpoint(part, key, len(data), digest, job.attempt)
        if not await checkpoints.record(self._pool, job, self._worker_id, checkpoint):
            log.info(
                "checkpoint %s not recorded (fenced, or kept before)", part, extra={"job_id": job.job_id}
            )


def _read_part(job_dir: Path, filename: str) -> bytes:
    """A part's bytes, read as outputs are (no symlink followed, a regular singly linked file:
    the job's child wrote the directory), refusing more than :data:`MAX_PART_BYTES`."""
    data = read_output(job_dir, filename, max_bytes=MAX_PART_BYTES + 1, subdir=CHECKPOINT_DIR)
    if len(data) > MAX_PART_BYTES:
        raise OSError(f"{filename} is larger than {MAX_PART_BYTES} bytes")
    return data
