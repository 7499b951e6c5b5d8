"""The ``ocr`` operation: the sandbox entry the ocrworker's children call.

``run("ocr", params, input_path, out_dir, limits=…)`` OCRs every selected page of one image or
PDF and writes the outputs the params ask for (:mod:`hypermedia.engines.ocr.params`):

1. **Checks** before any pixel is decoded: the params (languages against the installed ones);
   the file's size (``INPUT_TOO_LARGE``); its format from the magic bytes (a PDF, or an image
   format of :data:`LOADERS`; anything else, SVG included, is ``UNSUPPORTED_FORMAT``: an SVG's
   text is in its XML); the page count (``PDF_PAGE_LIMIT`` / ``INPUT_TOO_MANY_PAGES`` over
   :attr:`OcrLimits.max_document_pages`; ``OCR_PAGE_LIMIT`` when more than
   :attr:`OcrLimits.max_pages` pages are selected; ``INVALID_PARAMS`` for a page past the end);
   every selected page's pixel size from the image header, or from the PDF page's size in points
   at the render resolution (``INPUT_TOO_LARGE_PIXELS`` over :attr:`OcrLimits.max_page_pixels`
   or :data:`MAX_SIDE`), so a 256-megapixel image never reaches libvips' decoder or tesseract.
2. **Pages.** Images are decoded by libvips with the loader the magic bytes chose (libvips'
   untrusted loaders stay blocked; the loader it reports must be that one), one page at a time
   (``page=i`` of a multi-page TIFF, GIF, WebP or HEIF), the EXIF orientation applied; an
   HEVC-coded HEIF (an iPhone photo: :func:`hypermedia.engines.imaging.sources.heif_decoder` reads its
   codec from its boxes) is decoded by libheif instead (:mod:`hypermedia.engines.imaging.hevc`), one
   top-level image per page, ``irot``/``imir`` applied. PDFs are
   rendered by PDFium at :data:`PDF_DPI` (lower, down to :data:`MIN_PDF_DPI`, for a page that
   would exceed the pixel limit), in grey, with form fields drawn, in an engine process of their
   own (:mod:`hypermedia.engines.documents.engine_process`: PDFium aborting on a failed allocation is
   then ``RESOURCE_LIMIT``), before this process runs libvips; the renders wait as raw files (one
   byte per pixel: at most ``max_pages × max_page_pixels`` bytes, 174 MB for 20 A4 pages at 300 dpi) in a
   temporary directory under ``TMPDIR`` (the job directory in the sandbox), each deleted once
   loaded.
3. **Preprocessing** (:mod:`hypermedia.engines.ocr.preprocess`), the orientation detection gated
   (:mod:`hypermedia.engines.ocr.gate`: a page whose text lines run across it is read first and
   detected, turned and read again only when that reading is weak), then **one tesseract process per page**
   (:class:`hypermedia.engines.ocr.tesseract.Tesseract`) writing text, TSV and, when asked, hOCR and PDF
   in one run; :attr:`OcrLimits.page_timeout_seconds` of CPU per process (``OCR_PAGE_TIMEOUT``). The
   searchable PDF embeds the page as tesseract read it: grey, and upscaled or turned where
   preprocessing did so; a bilevel page stays bilevel through the deskew and is written with 1
   bit per pixel (the corpus' 8071 page: 189 KB deskewed; 850 KB when the turn was bilinear).
4. **Escalation** (:mod:`hypermedia.engines.ocr.escalation`), unless the ``escalate`` param is false: a
   page whose tesseract words have a mean confidence under
   :data:`~hypermedia.engines.ocr.escalation.ESCALATION_THRESHOLD` is read again, from the same
   preprocessed image, by RapidOCR (:class:`hypermedia.engines.ocr.rapid_ocr.RapidOcrEngine`, in this
   process, one thread), ordered by tesseract's blocks, and the better reading kept. Where
   RapidOCR wins, the page's text and words are its; its hOCR and searchable PDF page stay
   tesseract's (RapidOCR makes neither), and the words document says so. The CPU seconds RapidOCR
   took are reported (``escalation_cpu_seconds``); the escalated pages (``escalated_pages``) are
   billed as a line of their own (the ocrworker's ``charge_lines``). Escalation never fails a
   job: a page is not escalated when the job has less than :data:`ESCALATION_CPU_RESERVE` CPU
   seconds left, and when RapidOCR runs out of memory or time on a page, that page keeps
   tesseract's reading and no later page of the job is escalated (RapidOCR's memory grows from
   page to page: 2.3 GB of address space after two dense, blurred A4 pages).
5. **Outputs** (:mod:`hypermedia.engines.ocr.assemble`), see :func:`run`. A page without text is an empty
   page in every output, not an error.
6. **Checkpoints** (ADR 0069): every page read but the last is kept as a part
   (:func:`hypermedia.engines.contract.keep_part`: its record, text, hOCR and PDF page), which the
   worker stores beyond the attempt; a page an earlier attempt of the job kept is taken from its
   part (:func:`~hypermedia.engines.contract.resumed_part`, checked by
   :func:`hypermedia.engines.ocr.kept_pages.kept_page`) instead of being read again, so the
   outputs are those of one uninterrupted run.
7. **Fan-out** (ADR 0082, :mod:`hypermedia.engines.ocr.fanning`): a job selecting more than
   :attr:`OcrLimits.fan_out_pages` pages asks for child jobs before rendering any page; a
   child reads its group of pages and keeps each; the job's last run takes them, reads the rest
   and writes the outputs.

Runs libvips and PDFium: call :func:`run` in the sandbox child only; it forks (the PDF engine
process) before libvips has done any work. Importing this module is fork-safe.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pyvips

from hypermedia.core.errors import DomainError, PermanentJobError
from hypermedia.engines.contract import OutputFile, job_cpu_seconds_left, keep_part, resumed_part
from hypermedia.engines.imaging.sources import heif_decoder, reraise_vips_error
from hypermedia.engines.ocr import (
    escalation,
    fanning,
    gate,
    kept_pages,
    preprocess,
    rapid_ocr,
    tables,
    tesseract,
)
from hypermedia.engines.ocr.escalation import ESCALATION_THRESHOLD
from hypermedia.engines.ocr.outputs import job_summary, write_outputs
from hypermedia.engines.ocr.pages import (
    DEFAULT_PAGE_TIMEOUT,
    LOADERS,
    MAX_SIDE,
    MIN_PDF_DPI,
    PDF_DPI,
    OcrLimits,
    Page,
    hevc_sources,
    image_sources,
    pdf_sources,
)
from hypermedia.engines.ocr.params import (
    OPERATIONS,
    validate_params,
)
from hypermedia.engines.ocr.recognition import PageText
from hypermedia.intake import contenttype

__all__ = [
    "DEFAULT_PAGE_TIMEOUT",
    "ESCALATION_THRESHOLD",
    "LOADERS",
    "MAX_SIDE",
    "MIN_PDF_DPI",
    "OPERATIONS",
    "PDF_DPI",
    "OcrLimits",
    "OutputFile",
    "installed_languages",
    "run",
]

log = logging.getLogger(__name__)

installed_languages = tesseract.installed_languages

"""The languages an ``ocr`` job may ask for on this worker (for the RPC that lists them)."""

ESCALATION_CPU_RESERVE: Final = 60.0
"""CPU seconds the job must have left (:func:`~hypermedia.engines.contract.job_cpu_seconds_left`:
its CPU time less what it and its tesseract processes used) for a page to be escalated: RapidOCR took up to
38 s of CPU on one dense, blurred A4 page at 300 dpi (measured by the hostile review). Below it
the page keeps tesseract's reading (``cpu_budget``) rather than the whole job failing with
``TIMEOUT``."""

_PDF_MAGIC: Final = b"%PDF-"

# libvips loads and encodes here; every untrusted loader stays blocked. The operation cache is
# useless in a one-job process.
pyvips.block_untrusted_set(True)

pyvips.cache_set_max(0)


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: OcrLimits,
    preprocessing: bool = True,
) -> list[OutputFile]:
    """OCRs the selected pages of one image or PDF and writes the outputs into ``out_dir``.

    Args:
        operation: ``ocr``.
        params: as accepted by :func:`hypermedia.engines.ocr.params.validate_params` (validated again,
            languages against :func:`installed_languages`).
        input_path: the uploaded file.
        out_dir: existing directory for the outputs.
        limits: checked before any page is decoded or rendered.
        preprocessing: ``False`` skips :mod:`hypermedia.engines.ocr.preprocess` (the page is only made
            grey): bare tesseract, for the benchmark's comparison.

    Returns:
        One :class:`OutputFile` per requested output, in the order of
        :data:`hypermedia.engines.ocr.params.OUTPUTS`: ``text`` (``text.txt``, UTF-8, pages separated by a
        form feed), ``words`` (``words.json``, see :func:`_words_document`), ``hocr``
        (``text.hocr``, one hOCR document), ``searchable_pdf`` (``searchable.pdf``: every page
        image, as tesseract read it after preprocessing, with an invisible text layer; its page
        size is the image's at its resolution). Every output's metadata: ``page_count`` (pages
        in the input), ``pages`` (the numbers OCRed), ``languages``, ``chars``, ``word_count``,
        ``mean_confidence`` (0–100 over all words kept, whichever engine's, or null),
        ``source_format`` (``pdf``, ``tiff``, ``png``…), ``escalated_pages`` (how many pages
        RapidOCR read again: the extra work to charge), ``escalation_cpu_seconds`` (the CPU time
        it took, its imports and model loads included; 0.0 without escalation),
        ``skipped_pages`` (the numbers of PDF pages taken from their text layer, with
        ``skip_text_pages``), ``resumed_pages`` (the numbers of pages an earlier attempt of the
        job read, taken from its checkpoints: ADR 0069), ``size_bytes``.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS`` (also a page past the end).
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT``,
            ``INPUT_TOO_LARGE_PIXELS``, ``INPUT_TOO_MANY_PAGES``, ``PDF_PAGE_LIMIT``,
            ``OCR_PAGE_LIMIT``, ``PASSWORD_REQUIRED``, ``PDF_UNSUPPORTED_ENCRYPTION``,
            ``PARSE_ERROR``, ``OCR_PAGE_TIMEOUT``.
        TransientError: ``TIMEOUT`` (``RLIMIT_CPU``), ``OCR_ENGINE_UNAVAILABLE`` (no tesseract
            on this worker).
        MemoryError, OSError(EFBIG): libvips, PDFium, tesseract or RapidOCR hit the sandbox's
            memory or file size limit.
        hypermedia.engines.ocr.tesseract.TesseractFailure: tesseract failed otherwise (``INTERNAL``).
    """
    params = validate_params(operation, params, installed_languages=installed_languages())
    if input_path.stat().st_size > limits.max_input_bytes:
        raise PermanentJobError(
            f"The input is larger than the {limits.max_input_bytes} byte limit.", "INPUT_TOO_LARGE"
        )
    with input_path.open("rb") as f:
        head = f.read(contenttype.HEAD_BYTES)
    engine = tesseract.Tesseract(timeout_seconds=limits.page_timeout_seconds)
    second = (
        rapid_ocr.RapidOcrEngine(timeout_seconds=limits.page_timeout_seconds) if params["escalate"] else None
    )
    with tempfile.TemporaryDirectory(prefix="ocr-") as work:
        work_dir = Path(work)
        fingerprint = kept_pages.fingerprint(params)

        def kept_page(number: int) -> kept_pages.KeptPage | None:
            return kept_pages.kept_page(
                resumed_part(out_dir, f"page-{number:05d}"), number, work_dir, fingerprint, params
            )

        fanned: fanning.FannedRun | None = None
        if head.startswith(_PDF_MAGIC):
            source_format = "pdf"
            render = functools.partial(
                pdf_sources,
                input_path,
                work_dir,
                params["pages"],
                limits,
                skip_text=params["skip_text_pages"],
            )
            # A selection that fans out is planned from the page sizes before any page is rendered.
            page_count, selected, pages = render(most=limits.fan_out_pages)
        else:
            mime = contenttype.image_mime(head)
            if mime not in LOADERS:
                raise PermanentJobError(
                    "The input is not an image or PDF that OCR can read.", "UNSUPPORTED_FORMAT"
                )
            source_format = mime.removeprefix("image/")
            if LOADERS[mime] == "heifload" and heif_decoder(data := input_path.read_bytes()) == "hevc":
                page_count, pages = hevc_sources(data, params["pages"], limits)
            else:
                page_count, pages = image_sources(input_path, LOADERS[mime], params["pages"], limits)
            selected = [page.number for page in pages]  # none decoded yet: pages load when read
        if limits.fans_out(len(selected)) or limits.group is not None:
            fanned = fanning.fanned_run(selected, limits, out_dir, kept_page)
            if fanned is not None and fanned.request is not None:
                return [fanned.request]
            reads = None if fanned is None else fanned.read
            if source_format == "pdf" and not pages:  # nothing rendered yet: render what is read
                page_count, selected, pages = render(only=reads)
            elif reads is not None:
                read = frozenset(reads)
                pages = [page for page in pages if page.number in read]
        by_number = {page.number: page for page in pages}
        order = selected if fanned is None or not fanned.child else fanned.read
        records: list[dict[str, Any]] = []
        texts: list[str] = []
        hocr_pages: list[tuple[int, Path]] = []
        pdf_pages: list[Path] = []
        failed_before = False
        resumed: list[int] = []
        for number in order:
            page = by_number.get(number)
            if page is not None and page.text_layer is not None:
                records.append(_text_layer_record(page.number, page.text_layer))
                texts.append(page.text_layer)
                if page.original_pdf is not None:
                    pdf_pages.append(page.original_pdf)
                continue
            part = f"page-{number:05d}"
            if fanned is not None:
                kept = fanned.kept.get(number)
            else:
                kept = kept_page(number)
            if kept is None:
                assert page is not None, "a page neither kept nor read"
                result, record = _ocr_page(page, engine, second, work_dir, params, limits, preprocessing)
                text, hocr_path, pdf_path = result.text, result.hocr_path, result.pdf_path
            else:  # read by an earlier attempt of this job (ADR 0069) or by a child (ADR 0082)
                record, text, hocr_path, pdf_path = kept
                resumed.append(number)
            if failed_before and record["escalation"]["reason"] == "disabled":
                record["escalation"]["reason"] = "failed_earlier"
            if record["escalation"]["reason"].startswith("failed_"):
                # Not tried again in this job: what ran out (memory, time) has not come back.
                second, failed_before = None, True
            if kept is None and (number != order[-1] or (fanned is not None and fanned.child)):
                # A later attempt takes it from here (ADR 0069); after the last page there is
                # nothing to resume, except for a child, which reads pages for its parent (ADR 0082).
                keep_part(
                    out_dir,
                    part,
                    kept_pages.page_files(record, text, hocr_path, pdf_path) | {"made_by.json": fingerprint},
                )
            records.append(record)
            texts.append(text)
            if hocr_path is not None:
                hocr_pages.append((number, hocr_path))
            if pdf_path is not None:
                pdf_pages.append(pdf_path)
        if fanned is not None and fanned.child:
            return []  # its pages are its parent's parts
        summary = job_summary(records, page_count, params["languages"], source_format, resumed_pages=resumed)
        return list(write_outputs(params["outputs"], out_dir, summary, records, texts, hocr_pages, pdf_pages))


def _ocr_page(
    page: Page,
    engine: tesseract.Tesseract,
    second: rapid_ocr.RapidOcrEngine | None,
    work_dir: Path,
    params: dict,
    limits: OcrLimits,
    preprocessing: bool,
) -> tuple[PageText, dict[str, Any]]:
    """Preprocesses and recognises one page, escalating it to ``second`` when tesseract's mean
    confidence is under :attr:`OcrLimits.escalation_threshold`; returns the reading kept (with
    tesseract's hOCR and PDF) and the page's record in the words document."""
    what = f"page {page.number}"
    result, record, image_path = _read_page(page, engine, work_dir, params, limits, preprocessing, what)
    first_mean = result.mean_confidence
    confidences: dict[str, float | None] = {engine.name: _rounded(first_mean)}
    escalated, reason, cpu_seconds = False, "not_needed", 0.0
    if second is None:
        reason = "disabled"
    elif escalation.needs_escalation(result, limits.escalation_threshold):
        if job_cpu_seconds_left() < ESCALATION_CPU_RESERVE:
            reason = "cpu_budget"
        else:
            started = time.process_time()
            try:
                other = second.recognise(
                    image_path,
                    languages=params["languages"],
                    dpi=record["dpi"],
                    what=what,
                    layout=result.words,
                )
            except (MemoryError, DomainError) as exc:
                # tesseract's reading stands; the job goes on without the second engine.
                failure = "resource_limit" if isinstance(exc, MemoryError) else exc.error_code.lower()
                reason = f"failed_{failure}"
                log.warning("escalation of %s failed (%s); tesseract's reading is kept", what, failure)
            else:
                escalated = True
                confidences[second.name] = _rounded(other.mean_confidence)
                choice = escalation.choose(result, other)
                reason = choice.reason
                if choice.kept is other:
                    result = replace(other, hocr_path=result.hocr_path, pdf_path=result.pdf_path)
            cpu_seconds = time.process_time() - started
    elif first_mean is None:
        reason = "no_words"
    if params.get("table_detection"):
        # On the page as recognised: word boxes and pixels line up (rules are found in it).
        try:
            page_image = pyvips.Image.new_from_file(str(image_path), access="random")
            found = tables.detect_tables(result.words, page_image)
        except pyvips.Error as exc:
            reraise_vips_error(exc)
        del page_image
        record["blocks"] = [block.as_json() for block in tables.classify_blocks(result.words, found)]
        record["tables"] = [{**tables.to_json(t), "csv": tables.to_csv(t)} for t in found]
    image_path.unlink()
    record.update(
        engine=result.engine,
        mean_confidence=_rounded(result.mean_confidence),
        escalated=escalated,
        confidences=confidences,
        escalation={"reason": reason, "cpu_seconds": round(cpu_seconds, 3)},
        hocr_pdf_engine=engine.name,
        chars=len(result.text),
        word_count=len(result.words),
        words=[word.as_json() for word in result.words],
    )
    return result, record


def _text_layer_record(number: int, text: str) -> dict[str, Any]:
    """The words-document record of a page skipped for its text layer: no words (the layer has
    no boxes in the OCR's pixels), its text's length, and the reason."""
    return {
        "page": number,
        "skipped": "text_layer",
        "preprocessing": [],
        "gate": {"first_pass_confidence": None, "osd": False, "recognitions": 0},
        "engine": "text_layer",
        "mean_confidence": None,
        "escalated": False,
        "confidences": {},
        "escalation": {"reason": "skipped", "cpu_seconds": 0.0},
        "chars": len(text),
        "word_count": 0,
        "words": [],
    }


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


def _read_page(
    page: Page,
    engine: tesseract.Tesseract,
    work_dir: Path,
    params: dict,
    limits: OcrLimits,
    preprocessing: bool,
    what: str,
) -> tuple[PageText, dict[str, Any], Path]:
    """Loads, preprocesses and recognises one page, the orientation detection gated
    (:mod:`hypermedia.engines.ocr.gate`); returns tesseract's reading kept, the start of the
    page's record (``gate`` included) and the image it read (its outputs beside it)."""
    source = _load(page)

    def recognise(path: Path, record: dict[str, Any]) -> PageText:
        return engine.recognise(
            path,
            languages=params["languages"],
            dpi=record["dpi"],
            hocr="hocr" in params["outputs"],
            pdf="searchable_pdf" in params["outputs"],
            what=what,
        )

    image_path = work_dir / f"page-{page.number:05d}.png"
    record = _prepare(page, source, image_path, work_dir, limits, preprocessing, "gated", what)
    result = recognise(image_path, record)
    first, recognitions = result, 1
    step = gate.orientation_step(record["preprocessing"])
    osd = step is not None and step.get("reason") != "lines_horizontal"
    if gate.needs_orientation(record["preprocessing"], result):
        osd = True
        turned_path = work_dir / f"page-{page.number:05d}-osd.png"
        prepared = _prepare(page, source, turned_path, work_dir, limits, preprocessing, "detect", what)
        # needs_orientation found the gated record, and a detecting preparation always has one.
        detected = {**(gate.orientation_step(prepared["preprocessing"]) or {}), "after_first_pass": True}
        if detected["applied"]:
            recognitions = 2
            other = recognise(turned_path, prepared)
            if gate.keeps_turned(result, other):
                _discard(image_path)
                result, record, image_path = other, prepared, turned_path
            else:  # the page as it was is kept: not turned
                _discard(turned_path)
                detected.update(applied=False, reason="first_reading_kept")
        else:  # the same page: the first reading stands, with the detection's record
            _discard(turned_path)
        steps = record["preprocessing"]
        steps[steps.index(gate.orientation_step(steps))] = detected
    record["gate"] = gate.gate_record(first, osd=osd and preprocessing, recognitions=recognitions)
    return result, record, image_path


def _discard(image_path: Path) -> None:
    """Removes a page image and every output tesseract wrote beside it (same stem)."""
    for path in image_path.parent.glob(f"{image_path.stem}.*"):
        path.unlink()


def _load(page: Page) -> pyvips.Image:
    try:
        return page.load()
    except pyvips.Error as exc:
        reraise_vips_error(exc)


def _prepare(
    page: Page,
    source: pyvips.Image,
    image_path: Path,
    work_dir: Path,
    limits: OcrLimits,
    preprocessing: bool,
    orientation: str,
    what: str,
) -> dict[str, Any]:
    """Preprocesses ``source`` (the page loaded) and saves it as ``image_path``; returns the start
    of its record."""
    try:
        prepared = preprocess.prepare(
            source,
            work_dir=work_dir,
            max_pixels=limits.max_page_pixels,
            osd_timeout=limits.page_timeout_seconds,
            render_dpi=page.render_dpi,
            enabled=preprocessing,
            orientation=orientation,
            what=what,
        )
        preprocess.save(prepared, image_path)
    except pyvips.Error as exc:
        reraise_vips_error(exc)
    return {
        "page": page.number,
        "width": prepared.image.width,
        "height": prepared.image.height,
        "dpi": prepared.dpi,
        "source": {
            "width": prepared.source_width,
            "height": prepared.source_height,
            "dpi": page.render_dpi or prepared.source_dpi,
        },
        "to_source": prepared.to_source.as_list(),
        "preprocessing": prepared.steps,
    }
