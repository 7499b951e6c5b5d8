"""``python -m services.docworker``: the worker of queue ``documents`` (``pdf_info``,
``pdf_preview``, ``text_extract`` with PDFium; ``office_to_pdf`` and ``text_extract`` of office
documents with LibreOffice first). Configures :func:`hypermedia.worker.serve.serve_lanes`: the
pipeline :func:`hypermedia.engines.documents.pdf.run`, run in :class:`hypermedia.sandbox.Sandbox` children
whose zygote has imported pyvips and pypdfium2 (PDFium initialised, no thread started: see
:mod:`hypermedia.engines.documents.pdf`), and one warm LibreOffice listener per slot
(:class:`hypermedia.engines.documents.office.OfficePool`) that converts office documents to PDF before
the sandboxed PDFium step checks the PDF (``office_to_pdf``) or extracts its text.

Its defaults differ from the imageworker's: ``HM_WORKER_QUEUE`` is ``documents`` and
``HM_WORKER_SLOTS`` is 2 (the seed's documents profile: 2–4 jobs at once) when the environment
does not set them. Any queue other than ``documents`` is a configuration error (exit 78): this
worker knows no other operations. With root, jobs run as uids ``HM_SANDBOX_UID_BASE + i`` and
listeners as ``HM_SANDBOX_UID_BASE + slots + i``, so the slots are at most 32 (exit 78 above).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final

import asyncpg

from hypermedia.core import config
from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.documents.office import OfficePool
from hypermedia.engines.documents.pdf import DocumentLimits
from hypermedia.engines.documents.settings import OfficeSettings
from hypermedia.infra import db
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.intake import contenttype
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker import scheduled
from hypermedia.worker.handler import JobInput, SandboxHandler
from hypermedia.worker.serve import Lane, queue_worker_settings, serve_lanes
from hypermedia.worker.settings import WorkerSettings

QUEUE: Final = "documents"
DEFAULT_SLOTS: Final = 2
MAX_SLOTS_AS_ROOT: Final = 32
"""Half of the uid range each worker process gets (``platform.UID_RANGE_PER_REPLICA``): one uid
per job slot and one per listener."""
PRELOAD: Final = ("pyvips", "pypdfium2", "hypermedia.engines.documents.pdf")
CONVERTING_OPERATIONS: Final = frozenset({"office_to_pdf", "text_extract"})
"""Operations that accept an office document (converted to PDF first)."""


class DocumentHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.documents.pdf.run` with the profile's size and per-page pixel limits,
    after converting an office document to PDF with a warm LibreOffice listener."""

    entry = "hypermedia.engines.documents.pdf:run"
    checkpoints = True  # pdf_preview's pages, a part a second of rendering (ADR 0069)

    def __init__(self, office: OfficePool) -> None:
        self.office = office

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": DocumentLimits(max_input_bytes=job.max_input_bytes, max_page_pixels=job.max_pixels)}

    def reproducible(self, job: ClaimedJob) -> bool:
        """``office_to_pdf`` passes LibreOffice's PDF on, which carries its creation time and a
        random document id (``/ID``, XMP ``DocumentID``); every other operation's bytes come from
        PDFium and libvips alone."""
        return job.operation != "office_to_pdf"

    async def stage(self, job: ClaimedJob, job_input: JobInput, pool: asyncpg.Pool) -> JobInput:
        """The job's PDF password, when the request gave one, goes to the entry as ``password``
        (read from ``job_secrets`` now, never stored with the job). An office document becomes
        ``input/converted.pdf`` (the entry's input from then on); a PDF goes to the entry as it is.

        Raises:
            PermanentJobError: ``UNSUPPORTED_FORMAT`` for an office document and an operation
                that takes PDFs only (the gateway refuses those first); the conversion's errors
                (:meth:`OfficePool.convert`).
            TransientError: the conversion's (:meth:`OfficePool.convert`).
        """
        password = None
        async for attempt in db.retrying():  # across a Postgres restart, as the lifecycle writes
            with attempt:
                password = await jobsecrets.fetch_password(pool, job.job_id)
        if password is not None:
            job_input = dataclasses.replace(
                job_input, entry_kwargs={**job_input.entry_kwargs, "password": password}
            )
        if contenttype.kind(job_input.mime_type) != "office":
            return job_input
        if job.operation not in CONVERTING_OPERATIONS:
            raise PermanentJobError(f"{job.operation} takes PDFs only.", "UNSUPPORTED_FORMAT")
        conversion = await self.office.convert(
            job_input.path, job_input.mime_type, job.timeout_seconds, max_pdf_bytes=job.max_input_bytes
        )
        converted = job_input.job_dir / "input" / "converted.pdf"
        await asyncio.to_thread(converted.write_bytes, conversion.pdf)
        facts = {
            "source_mime_type": job_input.mime_type,
            "libreoffice_pages": conversion.pages,
            "conversion_ms": round(conversion.seconds * 1000),
        }
        return dataclasses.replace(
            job_input, path=converted, entry_kwargs={**job_input.entry_kwargs, "converted": facts}
        )


async def lane(stack: AsyncExitStack, settings: WorkerSettings) -> Lane:
    """The ``documents`` lane: its handler, with the office listeners started (in the background:
    jobs wait for a listener still starting) and stopped with ``stack``. With root the lane takes
    twice its slots in uids from ``HM_SANDBOX_UID_BASE`` (jobs, then listeners).

    Raises:
        config.ConfigError: more than :data:`MAX_SLOTS_AS_ROOT` slots as root, or invalid office
            settings (exit 78).
    """
    is_root = os.geteuid() == 0
    if is_root and settings.slots > MAX_SLOTS_AS_ROOT:
        raise config.ConfigError(
            f"invalid configuration:\n  HM_WORKER_SLOTS: the docworker runs at most {MAX_SLOTS_AS_ROOT} slots"
        )
    first = settings.sandbox_uid_base + settings.slots
    office = OfficePool(
        Path(settings.work_dir) / "office",
        [(first + i, first + i) if is_root else None for i in range(settings.slots)],
        config.load(OfficeSettings),
    )
    office.start()  # in the background: jobs wait for a listener still starting
    stack.push_async_callback(office.close)
    return Lane("docworker", settings, DocumentHandler(office), PRELOAD)


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    settings = queue_worker_settings("docworker", QUEUE, DEFAULT_SLOTS)
    await serve_lanes(stack, stop, await scheduled.with_consumers(stack, [(settings, "docworker", lane)]))


if __name__ == "__main__":
    run_service("docworker", serve)
