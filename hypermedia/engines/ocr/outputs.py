"""An ``ocr`` job's outputs from its pages' records: ``text``, ``words`` (JSON with the per-page
records and the job's summary), ``hocr``, ``searchable_pdf`` and the detected tables as CSV and
JSON (see :mod:`hypermedia.engines.ocr.engine`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from hypermedia.engines.contract import OutputFile
from hypermedia.engines.ocr import assemble, rapid_ocr, tesseract

MAX_TABLE_OUTPUTS: Final = 50

"""Most CSV outputs of one job (each a stored object of its own); the ``tables`` JSON holds every
table with its CSV whatever their number. A hostile page of number grids made 831 tables in 20 pages."""

TEXT_MIME: Final = "text/plain; charset=utf-8"

JSON_MIME: Final = "application/json"

HOCR_MIME: Final = "text/html; charset=utf-8"

PDF_MIME: Final = "application/pdf"

CSV_MIME: Final = "text/csv; charset=utf-8"


def job_summary(
    records: list[dict[str, Any]],
    page_count: int,
    languages: list[str],
    source_format: str,
    *,
    resumed_pages: Sequence[int] = (),
) -> dict:
    """The job's summary over its page records: page and word counts, mean confidence, escalated
    pages, the languages, the source format and what preprocessing ran on each page (the
    metadata every output carries): ``page_steps``, one ``{"page": 1, "applied": ["upscale",
    "deskew"], "osd": false, "recognitions": 1}`` per page read (``applied``: the steps that
    changed the page, in order; ``osd``: whether tesseract's orientation detection ran;
    ``recognitions``: tesseract runs, 2 when the page was turned after a first reading, 0 for a
    page taken from its text layer); ``resumed_pages``: the pages taken from an earlier attempt's
    checkpoints."""
    words = sum(record["word_count"] for record in records)
    confidence = sum(
        record["mean_confidence"] * record["word_count"] for record in records if record["word_count"]
    )
    return {
        "page_count": page_count,
        "pages": [record["page"] for record in records],
        "languages": languages,
        "chars": sum(record["chars"] for record in records),
        "word_count": words,
        "mean_confidence": round(confidence / words, 2) if words else None,
        "source_format": source_format,
        "escalated_pages": sum(1 for record in records if record["escalated"]),
        "skipped_pages": [record["page"] for record in records if record.get("skipped")],
        "resumed_pages": list(resumed_pages),
        "escalation_cpu_seconds": round(sum(record["escalation"]["cpu_seconds"] for record in records), 3),
        "page_steps": [
            {
                "page": record["page"],
                "applied": [step["step"] for step in record["preprocessing"] if step["applied"]],
                "osd": record["gate"]["osd"],
                "recognitions": record["gate"]["recognitions"],
            }
            for record in records
        ],
    }


def _words_document(summary: dict, records: list[dict[str, Any]]) -> dict:
    """``words.json``::

        {"engine": {"name": "tesseract", "version": "5.3.0"}, "languages": ["eng"],
         "page_count": 1,
         "pages": [{"page": 1, "width": 960, "height": 720, "dpi": 300,
                    "source": {"width": 640, "height": 480, "dpi": 200.0},
                    "to_source": [a, b, c, d, e, f],
                    "preprocessing": [{"step": "background", "applied": false, "reason": "bilevel"}, …],
                    "gate": {"first_pass_confidence": 96.4, "osd": false, "recognitions": 1},
                    "engine": "tesseract", "mean_confidence": 95.1, "escalated": false,
                    "confidences": {"tesseract": 95.1},
                    "escalation": {"reason": "not_needed", "cpu_seconds": 0.0},
                    "hocr_pdf_engine": "tesseract", "chars": 286, "word_count": 58,
                    "words": [{"text": "This", "bbox": [x, y, w, h], "conf": 96.3,
                               "block": 1, "par": 1, "line": 1, "word": 1}, …]}]}

    ``width``/``height``/``dpi`` are the page as tesseract read it (after preprocessing), word
    boxes in its pixels; ``to_source`` maps such a point ``(x, y)`` to the source page (``source``,
    as displayed): ``(a·x + b·y + c, d·x + e·y + f)``. ``source.dpi`` is the render resolution of a
    PDF page, the believable resolution an image states, or null.

    Escalation, per page: ``engine`` is the engine whose text and words were kept (``tesseract``
    or ``rapidocr``) and ``mean_confidence`` that reading's mean (0–100); ``escalated`` is true
    when RapidOCR read the page too; ``confidences`` holds each engine's raw mean word confidence
    (0–100; ``rapidocr`` only when escalated; these are not on one scale, see
    :mod:`hypermedia.engines.ocr.escalation`); ``escalation.reason`` is ``not_needed``, ``no_words``,
    ``disabled``, ``skipped`` (a page taken from its text layer), ``cpu_budget`` (the page needed
    escalation but the job had less than :data:`ESCALATION_CPU_RESERVE` CPU seconds left),
    ``failed_resource_limit`` / ``failed_ocr_page_timeout`` (RapidOCR ran out of memory or time
    on it: tesseract's reading is kept, the page is not charged as escalated, and no later page
    of the job is escalated: ``failed_earlier``) or, when escalated,
    :attr:`hypermedia.engines.ocr.escalation.Choice.reason`; ``escalation.cpu_seconds`` the CPU time
    RapidOCR took on it. ``hocr_pdf_engine`` is always
    ``tesseract``: the hOCR and the searchable PDF page come from tesseract's run even where
    RapidOCR's words were kept. ``escalation_engine`` (top level) names RapidOCR's version when a
    page was escalated.
    """
    document: dict[str, Any] = {
        "engine": {"name": tesseract.Tesseract.name, "version": tesseract.version()},
        "languages": summary["languages"],
        "page_count": summary["page_count"],
        "pages": records,
    }
    if summary["escalated_pages"]:
        document["escalation_engine"] = {
            "name": rapid_ocr.RapidOcrEngine.name,
            "version": rapid_ocr.version(),
        }
    return document


def _write(path: Path, data: bytes) -> int:
    with path.open("wb") as f:
        f.write(data)
    return len(data)


def _table_outputs(out_dir: Path, summary: dict, records: list[dict[str, Any]]) -> Iterator[OutputFile]:
    """``tables``: one JSON document (per page: blocks classified text/table, every table's rows
    and cells and its CSV, see :func:`hypermedia.engines.ocr.tables.to_json`), and one CSV output per
    table, output type ``table_p{page}_{n}``, for the first :data:`MAX_TABLE_OUTPUTS` tables (the
    ``tables`` output's metadata: ``table_count``, ``csv_outputs``)."""
    pages = [
        {"page": r["page"], "blocks": r.get("blocks", []), "tables": r.get("tables", [])} for r in records
    ]
    data = json.dumps({"pages": pages}, ensure_ascii=False, separators=(",", ":")).encode()
    size = _write(out_dir / "tables.json", data)
    count = sum(len(p["tables"]) for p in pages)
    csv_outputs = min(count, MAX_TABLE_OUTPUTS)
    yield OutputFile(
        "tables",
        "tables.json",
        JSON_MIME,
        {**summary, "size_bytes": size, "table_count": count, "csv_outputs": csv_outputs},
    )
    numbered = ((page, i, table) for page in pages for i, table in enumerate(page["tables"], 1))
    for page, i, table in itertools.islice(numbered, csv_outputs):
        filename = f"page-{page['page']:03d}-table-{i}.csv"
        size = _write(out_dir / filename, table["csv"].encode())
        metadata = {"page": page["page"], "table": i, "rows": table["n_rows"], "columns": table["n_cols"]}
        # One output type per table (a rendition's key is made from its type). Its own facts only:
        # the job's summary is on the other outputs (hundreds of tables would repeat it).
        yield OutputFile(f"table_p{page['page']}_{i}", filename, CSV_MIME, {"size_bytes": size, **metadata})


def write_outputs(
    outputs: list[str],
    out_dir: Path,
    summary: dict,
    records: list[dict[str, Any]],
    texts: list[str],
    hocr_pages: list[tuple[int, Path]],
    pdf_pages: list[Path],
) -> Iterator[OutputFile]:
    """Writes each output ``outputs`` names into ``out_dir`` and yields its :class:`OutputFile`,
    the ``summary`` in its metadata."""
    for name in outputs:
        if name == "text":
            size = _write(out_dir / "text.txt", assemble.join_text(texts).encode())
            yield OutputFile("text", "text.txt", TEXT_MIME, {**summary, "size_bytes": size})
        elif name == "words":
            document = _words_document(summary, records)
            data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
            size = _write(out_dir / "words.json", data)
            yield OutputFile("words", "words.json", JSON_MIME, {**summary, "size_bytes": size})
        elif name == "hocr":
            size = _write(out_dir / "text.hocr", assemble.merge_hocr(hocr_pages).encode())
            yield OutputFile("hocr", "text.hocr", HOCR_MIME, {**summary, "size_bytes": size})
        elif name == "searchable_pdf":
            target = out_dir / "searchable.pdf"
            assemble.merge_pdfs(pdf_pages, target)
            yield OutputFile(
                "searchable_pdf", "searchable.pdf", PDF_MIME, {**summary, "size_bytes": target.stat().st_size}
            )
        elif name == "tables":
            yield from _table_outputs(out_dir, summary, records)
