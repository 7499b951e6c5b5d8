"""``python -m services.ocrworker``: the worker of queue ``ocr`` (the ``ocr`` operation: tesseract
with preprocessing, table detection and escalation to RapidOCR; :mod:`hypermedia.engines.ocr.engine`).
Configures :func:`hypermedia.worker.serve.serve_lanes`: the engine runs in
:class:`hypermedia.sandbox.Sandbox` children whose zygote has imported pyvips, pypdfium2 and the
engine (RapidOCR and onnxruntime load in the child that escalates a page: onnxruntime starts
thread pools, which a zygote that forks must not have). Each child runs one tesseract process at
a time with ``OMP_THREAD_LIMIT=1``, so a slot is one core.

Its defaults differ from the imageworker's: ``HM_WORKER_QUEUE`` is ``ocr`` and ``HM_WORKER_SLOTS``
is 2 (the seed's ocr profile: 1–2 jobs at once) when the environment does not set them. Any queue
other than ``ocr`` is a configuration error (exit 78).

The worker reports the recognition languages its tesseract has (``tesseract --list-langs``) into
``ocr_languages`` when it starts and every hour (:data:`LANGUAGE_REPORT_SECONDS`): the gateway
refuses an ``ocr`` job asking for another one (422) and lists them (``ListOcrLanguages``,
``GET /v1/ocr/languages``). A worker without tesseract reports nothing and fails its jobs with
``OCR_ENGINE_UNAVAILABLE`` (transient: another replica may have it).

A job selecting more than ``HM_OCR_FAN_OUT_PAGES`` pages fans out (ADR 0082,
:class:`services.ocrworker.settings.OcrSettings`): its first run asks for child jobs, each
reading a group of pages and keeping them as the job's checkpoint parts; the job then reads its
last group and assembles every page's reading into its outputs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any, Final

from hypermedia.core import config
from hypermedia.core.errors import DomainError
from hypermedia.engines.ocr import tesseract
from hypermedia.engines.ocr.engine import OcrLimits
from hypermedia.engines.ocr.params import MAX_FANNED_OCR_PAGES
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.sandbox import DEFAULT_CHILD_ENV, OutputFile
from hypermedia.worker import scheduled
from hypermedia.worker.handler import SandboxHandler
from hypermedia.worker.runtime import WorkerRuntime
from hypermedia.worker.serve import Lane, queue_worker_settings, serve_lanes
from hypermedia.worker.settings import WorkerSettings
from services.ocrworker.settings import OcrSettings

log = logging.getLogger(__name__)

QUEUE: Final = "ocr"
DEFAULT_SLOTS: Final = 2
LANGUAGE_REPORT_SECONDS: Final = 3600.0
"""How often a worker reports its languages again; the gateway forgets a worker's report after a
day (``services.gateway.creation.OCR_LANGUAGES_MAX_AGE``), so a stopped worker's languages go."""
ESCALATION_LINE: Final = "ocr_escalation"
"""The charge line of pages read again by the second engine."""


class OcrHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.ocr.engine.run` with the profile's size and per-page pixel
    limits and ``settings``' fan-out (its defaults without), and charges escalated pages as a
    line of their own."""

    entry = "hypermedia.engines.ocr.engine:run"
    checkpoints = True  # a page at a time (ADR 0069)
    checkpoint_max_parts = MAX_FANNED_OCR_PAGES  # the pages of a fanned-out job (ADR 0082)
    checkpoint_job_bytes = 1024 * 1024 * 1024
    """A page's part is its record, text, hOCR and PDF page: 0.2–2 MB (a grey A4 page at 300 dpi)."""

    def __init__(self, settings: OcrSettings | None = None) -> None:
        self.settings = settings or config.load(OcrSettings)

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {
            "limits": OcrLimits(
                max_input_bytes=job.max_input_bytes,
                max_page_pixels=job.max_pixels,
                fan_out_pages=self.settings.fan_out_pages or None,
                fan_out_group_pages=self.settings.fan_out_group_pages,
                fan_out=not job.fanned_out and job.parent_job_id is None,
                group=job.chunk_index,
            )
        }

    def charge_lines(self, job: ClaimedJob, outputs: list[OutputFile]) -> dict[str, int]:
        """``{"ocr_escalation": escalated_pages × the profile's escalation_per_page}`` when pages
        were escalated (every output's metadata carries the same ``escalated_pages``)."""
        pages = max((int(o.metadata.get("escalated_pages", 0)) for o in outputs), default=0)
        amount = pages * job.escalation_per_page
        return {ESCALATION_LINE: amount} if amount else {}


async def report_languages(runtime: WorkerRuntime) -> None:
    """Replace this worker's rows of ``ocr_languages`` with the languages tesseract has, and drop
    reports older than a week (workers long gone). Nothing when tesseract is missing (logged)."""
    try:
        languages = await asyncio.to_thread(tesseract.installed_languages)
    except (DomainError, tesseract.TesseractFailure) as exc:
        log.error("tesseract is not usable on this worker: %s", exc)
        return
    async with runtime.pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM ocr_languages WHERE worker_id = $1", runtime.worker_id)
        await conn.executemany(
            "INSERT INTO ocr_languages (worker_id, language) VALUES ($1, $2)",
            [(runtime.worker_id, language) for language in languages],
        )
        await conn.execute("DELETE FROM ocr_languages WHERE reported_at < now() - interval '7 days'")
    log.info("languages reported: %s", " ".join(languages))


PASSED_ENV: Final = ("TESSDATA_PREFIX",)
"""Variables of the worker's environment its jobs get too: the models' directory that
``tesseract --list-langs`` read for the language report must be the one the jobs' tesseract reads."""


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The jobs' environment: the sandbox's default plus :data:`PASSED_ENV` where ``environ`` has it."""
    return {**DEFAULT_CHILD_ENV, **{name: environ[name] for name in PASSED_ENV if name in environ}}


async def lane(stack: AsyncExitStack, settings: WorkerSettings) -> Lane:
    """The ``ocr`` lane: its handler, children with ``TESSDATA_PREFIX``, and the report of the
    installed languages every :data:`LANGUAGE_REPORT_SECONDS`."""
    return Lane(
        "ocrworker",
        settings,
        OcrHandler(config.load(OcrSettings)),
        ("pyvips", "pypdfium2", "hypermedia.engines.ocr.engine"),
        periodic=(LANGUAGE_REPORT_SECONDS, report_languages),
        child_env=child_env(os.environ),
    )


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    settings = queue_worker_settings("ocrworker", QUEUE, DEFAULT_SLOTS)
    await serve_lanes(stack, stop, await scheduled.with_consumers(stack, [(settings, "ocrworker", lane)]))


if __name__ == "__main__":
    run_service("ocrworker", serve)
