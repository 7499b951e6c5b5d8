"""Checkpoints: a job's finished parts, kept beyond the attempt that made them (issue 23 item 1,
ADR 0069).

An engine that works in parts (``ocr``: a page at a time) keeps each finished part as one file,
``checkpoints/{part}.zip`` in its job directory (:func:`hypermedia.engines.contract.keep_part`);
the worker records it here with its attempt (:func:`record`, fenced: only the live attempt
records) and then uploads it under the job's prefix (:func:`key_of`). The next attempt of the job — a
retry, a hand-back after a drain or a spot notice — gets a GET URL of every recorded part with
its grant (storage ``GrantJob``), puts them in ``resume/`` of its job directory, and the engine
takes those parts from there (:func:`hypermedia.engines.contract.resumed_part`) and does only the
rest. Storage's sweep deletes the checkpoints of jobs that ended, whatever the outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import asyncpg

from hypermedia.jobs.lifecycle import ClaimedJob

PART: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,11}")
"""A part's name (``page-00012``), at most 12 characters so that its key's last segment,
``checkpoint-{job_id}-{part}.zip`` (52 characters beside the part), is an output type storage
accepts (``services.storage.backends.OUTPUT_TYPE``: at most 64)."""


@dataclass(frozen=True)
class Checkpoint:
    """One recorded part of a job."""

    part: str
    key: str
    size_bytes: int
    sha256: str
    attempt: int


def key_of(prefix: str, job_id: str, part: str) -> str:
    """The store key of ``part`` of ``job_id`` under the job's output prefix
    (``derived/{pool}/{object}/{version}/``): ``checkpoint-{job_id}-{part}.zip``. Storage presigns
    and deletes only keys of this form. Raises ValueError for a bad part name."""
    if not PART.fullmatch(part):
        raise ValueError(f"bad checkpoint part name {part!r}")
    return f"{prefix}checkpoint-{job_id}-{part}.zip"


def is_key_of(key: str, prefix: str, job_id: str, part: str) -> bool:
    """Whether ``key`` is the store key of ``part`` of ``job_id`` (:func:`key_of`); False, not
    ValueError, for a part name :data:`PART` does not take (a row written before part names were
    bounded to 12 characters: storage then neither presigns nor deletes through it)."""
    return PART.fullmatch(part) is not None and key == key_of(prefix, job_id, part)


async def record(pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, checkpoint: Checkpoint) -> bool:
    """Records ``checkpoint`` of ``job`` as made by this attempt, before its bytes are uploaded,
    if the attempt is still the live one (``claimed_by`` and ``attempt_count`` match, the job
    running); a part an earlier attempt recorded is taken over (its bytes are replaced by the
    upload that follows). A child job's part (:mod:`hypermedia.jobs.lifecycle.children`) is its
    parent's — ``checkpoint.key`` must be the parent's (:func:`owner_of`) — recorded with the
    parent's last attempt and ``made_by_job`` the child, and only while the parent has not ended
    and no cancel was asked of it (a parent handed back by a drain, queued again, takes the parts
    its children keep meanwhile). Returns False when fenced: the caller then uploads nothing."""
    recorded = await pool.fetchval(
        """
        INSERT INTO job_checkpoints (job_id, part, key, size_bytes, sha256, attempt, made_by_job)
        SELECT coalesce(j.parent_job_id, j.job_id), $4, $5, $6, $7, coalesce(p.attempt_count, j.attempt_count),
               CASE WHEN j.parent_job_id IS NOT NULL THEN j.job_id END
        FROM processing_jobs j LEFT JOIN processing_jobs p ON p.job_id = j.parent_job_id
        WHERE j.job_id = $1 AND j.claimed_by = $2 AND j.attempt_count = $3
          AND j.status IN ('claimed', 'processing', 'cancel_requested')
          AND (j.parent_job_id IS NULL OR p.status IN ('queued', 'retry_wait', 'claimed', 'processing'))
        ON CONFLICT (job_id, part) DO UPDATE SET key = EXCLUDED.key, size_bytes = EXCLUDED.size_bytes,
            sha256 = EXCLUDED.sha256, attempt = EXCLUDED.attempt, made_by_job = EXCLUDED.made_by_job,
            created_at = now()
        RETURNING part
        """,
        job.job_id,
        worker_id,
        job.attempt,
        checkpoint.part,
        checkpoint.key,
        checkpoint.size_bytes,
        checkpoint.sha256,
    )
    return recorded is not None


def owner_of(job: ClaimedJob) -> str:
    """The job whose parts ``job`` keeps: its parent's for a child job, else its own."""
    return job.parent_job_id or job.job_id


async def of_job(pool: asyncpg.Pool | asyncpg.Connection, job_id: str) -> list[Checkpoint]:
    """The recorded checkpoints of ``job_id``, by part name."""
    rows = await pool.fetch(
        "SELECT part, key, size_bytes, sha256, attempt FROM job_checkpoints WHERE job_id = $1 ORDER BY part",
        job_id,
    )
    return [Checkpoint(r["part"], r["key"], r["size_bytes"], r["sha256"], r["attempt"]) for r in rows]


async def forget(pool: asyncpg.Pool, job_id: str, parts: list[str]) -> None:
    """Drops the rows of ``parts`` of ``job_id`` (their bytes deleted)."""
    await pool.execute(
        "DELETE FROM job_checkpoints WHERE job_id = $1 AND part = ANY($2::text[])", job_id, parts
    )


async def postpone(pool: asyncpg.Pool, parts: list[tuple[str, str]]) -> None:
    """Moves the rows of ``[(job_id, part)]`` behind every other (``created_at`` now): parts
    whose bytes the store would not delete, tried again after the rest."""
    if parts:
        await pool.executemany(
            "UPDATE job_checkpoints SET created_at = now() WHERE job_id = $1::uuid AND part = $2", parts
        )
