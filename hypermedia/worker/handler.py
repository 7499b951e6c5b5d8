"""What a worker service plugs into the runtime: its :class:`JobHandler` (the sandbox entry and its
keyword arguments, staging of the input, charge lines, admission, sandbox limits) and what an entry
is given (:class:`JobInput`). :class:`SandboxHandler` is the plain handler most services extend."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from hypermedia.engines.contract import MAX_PART_BYTES
from hypermedia.jobs import charges, lifecycle
from hypermedia.sandbox import OutputFile, SandboxLimits
from hypermedia.worker.checkpointing import MAX_JOB_BYTES, MAX_PARTS
from hypermedia.worker.unit import peer


@dataclass(frozen=True)
class JobInput:
    """What a job's sandbox entry is given, as the runtime prepared it."""

    path: Path
    """The file the entry gets as ``input_path`` (first the downloaded original,
    ``{job_dir}/input/source``)."""
    mime_type: str
    """The original's type as identified at upload."""
    job_dir: Path
    """The job's sandbox directory (``input/`` and ``output/`` inside)."""
    entry_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the entry (picklable; limits from the profile)."""


class JobHandler(Protocol):
    """What a worker service plugs into the runtime: the sandbox entry point and its arguments."""

    entry: str
    """``module:function`` run in the sandbox child as ``fn(operation, params, input_path, out_dir, **kwargs)``."""
    checkpoints: bool
    """Whether the entry keeps finished parts (:func:`hypermedia.engines.contract.keep_part`) for
    the worker to store and restore beyond the attempt (:mod:`hypermedia.worker.checkpointing`)."""
    checkpoint_part_bytes: int
    """Largest part the worker keeps or restores, in bytes (64 MiB: an OCR page or a second of
    preview pages; a transcode's rendition is far larger)."""
    checkpoint_job_bytes: int
    """Most bytes of parts one attempt keeps, and restores (256 MiB by default)."""
    checkpoint_max_parts: int
    """Most parts one attempt keeps, and restores (64 by default; the ocrworker's: 500, the pages
    of a fanned-out job, ADR 0082)."""
    checkpoint_operations: frozenset[str] | None
    """The operations whose jobs keep parts (``None``: every one; the mediaworker's:
    ``transcode_video`` only), so that another operation's child cannot have parts stored."""

    def entry_kwargs(self, job: lifecycle.ClaimedJob) -> dict[str, Any]:
        """Extra keyword arguments of the entry for this job (picklable; limits from the profile)."""
        ...

    async def stage(self, job: lifecycle.ClaimedJob, job_input: JobInput, pool: asyncpg.Pool) -> JobInput:
        """Work the worker does itself after the download and before the sandbox child runs,
        such as the docworker's LibreOffice conversion (which has its own confinement); returns
        the input the entry gets (``job_input`` itself when there is nothing to do). Counts against
        nothing but the job's lease. Raises ``DomainError`` to fail the job with its code."""
        ...

    def charge_lines(self, job: lifecycle.ClaimedJob, outputs: list[OutputFile]) -> dict[str, int]:
        """Millicredits a completed job is charged beside its profile's price, by line name
        (``{"ocr_escalation": 600}``) from what the entry reported in its outputs' metadata;
        ``{}`` for most operations. Each becomes a ledger row of its own (``CommitRequest.lines``)."""
        ...

    def admit(self, job: lifecycle.ClaimedJob) -> contextlib.AbstractAsyncContextManager[None]:
        """The job's admission beyond the worker's slots, such as the mediaworker's coordinator
        (at most N video transcodes at once): the runtime enters it after the download, holds it
        through the stage and the sandbox run, and leaves it before the upload. Entering may wait;
        a job not admitted within :data:`hypermedia.worker.runtime.ADMISSION_NOTICE_SECONDS` records one ``waiting``
        progress event, and stays running meanwhile (its lease is extended, a cancel request
        stops the wait and the job ends ``cancelled`` without running).

        Entering runs in a task of its own (so that the wait can be interrupted) and leaving runs
        in the job's task: the context manager must not depend on the current task (an
        ``asyncio.Semaphore`` does not; an ``asyncio.timeout`` would). Entering may be cancelled
        and must then leave nothing held."""
        ...

    def attach_control(self, link: peer.ControlLink) -> None:
        """Execution of a unit: ``link`` to control is open and its evidence matched (before any
        job is admitted). The mediaworker's handler asks control's media coordinator from then
        on (:mod:`hypermedia.worker.unit.coordinator`)."""
        ...

    def reproducible(self, job: lifecycle.ClaimedJob) -> bool:
        """Whether a re-run of ``job`` writes the same bytes (libvips, PDFium, FFmpeg at one
        thread, tesseract: yes; LibreOffice's PDFs carry their creation time and a random
        document id, libx264 with frame threads varies: no). The
        outputs of a job that is not get keys of their own job and attempt
        (:func:`hypermedia.worker.transfer.rendition_name`, ADR 0050)."""
        ...

    def sandbox_limits(self, job: lifecycle.ClaimedJob, limits: SandboxLimits) -> SandboxLimits:
        """The rlimits of the job's sandbox child, given those the runtime derived from the
        profile (CPU = timeout, wall = timeout × 1.5, ``RLIMIT_AS`` = ``memory_limit_mb``,
        ``RLIMIT_FSIZE`` 10 GiB, ``RLIMIT_NPROC`` 16): ``limits`` itself, or a copy with a field
        changed (``dataclasses.replace``), e.g. ``nproc`` raised for an encoder's threads."""
        ...


class SandboxHandler:
    """The default hooks of a :class:`JobHandler`: nothing staged (everything happens in the
    sandbox), no charge beside the profile's price, admitted at once, the profile's limits. A
    worker service subclasses it, sets ``entry`` and ``entry_kwargs``, and overrides a hook only
    where it does more."""

    checkpoints = False
    checkpoint_part_bytes = MAX_PART_BYTES
    checkpoint_job_bytes = MAX_JOB_BYTES
    checkpoint_max_parts = MAX_PARTS
    checkpoint_operations: frozenset[str] | None = None

    async def stage(self, job: lifecycle.ClaimedJob, job_input: JobInput, pool: asyncpg.Pool) -> JobInput:
        return job_input

    def charge_lines(self, job: lifecycle.ClaimedJob, outputs: list[OutputFile]) -> dict[str, int]:
        return {}

    def admit(self, job: lifecycle.ClaimedJob) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def attach_control(self, link: peer.ControlLink) -> None:
        return None

    def reproducible(self, job: lifecycle.ClaimedJob) -> bool:
        return True

    def sandbox_limits(self, job: lifecycle.ClaimedJob, limits: SandboxLimits) -> SandboxLimits:
        return limits


FSIZE_LIMIT_BYTES = 10 * 1024**3
"""RLIMIT_FSIZE of a sandboxed job: the seed's 10 GB of temp space."""


def profile_limits(job: lifecycle.ClaimedJob) -> SandboxLimits:
    """The rlimits the job's profile gives its sandbox child, before its handler's
    (:meth:`JobHandler.sandbox_limits`): CPU = timeout, wall = timeout × 1.5 (seconds),
    ``RLIMIT_AS`` = ``memory_limit_mb``, ``RLIMIT_FSIZE`` :data:`FSIZE_LIMIT_BYTES`."""
    return SandboxLimits(
        cpu_seconds=job.timeout_seconds,
        wall_seconds=job.timeout_seconds * 1.5,
        memory_bytes=job.memory_limit_mb * 1024 * 1024,
        fsize_bytes=FSIZE_LIMIT_BYTES,
    )


def completion_charge(
    handler: JobHandler, job: lifecycle.ClaimedJob, outputs: list[OutputFile]
) -> charges.Charge:
    """What the completed ``job`` is charged: the work its ``outputs`` report, priced by its profile
    (:func:`charges.for_completion`), with ``handler``'s own lines (:meth:`JobHandler.charge_lines`:
    an OCR job's escalation, within its allowance) beside."""
    measured = charges.for_completion(
        price=job.estimated_credits,
        base_cost=job.base_cost,
        work_unit=job.work_unit,
        per_unit=job.per_unit,
        metadata=[o.metadata for o in outputs],
    )
    extra = handler.charge_lines(job, outputs)
    return charges.Charge(measured.actual + sum(extra.values()), measured.lines | extra)
