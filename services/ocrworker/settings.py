"""The ocrworker's own settings (when a long document fans out)."""

from __future__ import annotations

from pydantic import Field

from hypermedia.core.config import ComponentSettings
from hypermedia.engines.ocr.params import MAX_OCR_PAGES


class OcrSettings(ComponentSettings):
    """When an ``ocr`` job's pages are read by child jobs (ADR 0082), read beside the worker's
    :class:`~hypermedia.worker.settings.WorkerSettings`."""

    fan_out_pages: int = Field(MAX_OCR_PAGES, ge=0, le=MAX_OCR_PAGES, validation_alias="HM_OCR_FAN_OUT_PAGES")
    """An ``ocr`` job selecting more pages than this (0: never) fans out: child jobs on any OCR
    worker read its pages in groups, and the job reads its last group and assembles the outputs
    (``OcrLimits.fan_out_pages``); such a job may select up to
    :data:`~hypermedia.engines.ocr.params.MAX_FANNED_OCR_PAGES` pages. At most
    :data:`~hypermedia.engines.ocr.params.MAX_OCR_PAGES` (20), the most one job reads itself:
    a larger value would refuse the documents in between."""
    fan_out_group_pages: int = Field(
        10, ge=1, le=MAX_OCR_PAGES, validation_alias="HM_OCR_FAN_OUT_GROUP_PAGES"
    )
    """Pages one child reads (fewer where a job would have fewer than three groups, more where it
    would have more than 60: :func:`hypermedia.engines.ocr.fanning.page_groups`)."""
