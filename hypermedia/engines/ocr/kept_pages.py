"""An ``ocr`` page kept beyond its attempt (ADR 0069) or read by a child job for its parent
(ADR 0082): what a page's checkpoint part holds (:func:`page_files`), what it must have been
made by (:func:`fingerprint`), and a part taken back (:func:`kept_page`), checked to assemble
as a page read now would. Runs PDFium (a kept PDF page is opened): call in the sandbox child."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

from hypermedia.engines.ocr import assemble, tesseract
from hypermedia.engines.ocr.outputs import job_summary, write_outputs

KeptPage = tuple[dict[str, Any], str, Path | None, Path | None]
"""A page taken from its part: its record, text, hOCR and PDF page."""

CHECKPOINT_FORMAT: Final = 1
"""The version of a kept page's part (ADR 0069); raise it with any change to a page's record or
to how a page is read, so that pages kept by the old code are read again, not mixed in."""


def fingerprint(params: dict) -> bytes:
    """What a kept page must have been made by to be taken (``made_by.json`` of its part): this
    part format (:data:`CHECKPOINT_FORMAT`), the same tesseract and the same params. A page kept
    by another version (a drain in a deploy) is read again rather than mixed in."""
    made_by = {"format": CHECKPOINT_FORMAT, "tesseract": tesseract.version(), "params": params}
    return json.dumps(made_by, sort_keys=True, separators=(",", ":")).encode()


def page_files(
    record: dict[str, Any], text: str, hocr_path: Path | None, pdf_path: Path | None
) -> dict[str, bytes]:
    """What a page's checkpoint keeps: its record, its text, and its hOCR and PDF page when made."""
    files = {"record.json": json.dumps(record).encode(), "text.txt": text.encode()}
    if hocr_path is not None:
        files["page.hocr"] = hocr_path.read_bytes()
    if pdf_path is not None:
        files["page.pdf"] = pdf_path.read_bytes()
    return files


def kept_page(
    kept: dict[str, bytes] | None, number: int, work_dir: Path, fingerprint: bytes, params: dict
) -> KeptPage | None:
    """A page an earlier attempt (or a child job, ADR 0082) read, from its checkpoint
    (:func:`page_files`): its record, text, and hOCR and PDF page written back into
    ``work_dir``; None without one, for one made by another version or params
    (:func:`fingerprint`), or for one that is not whole or does not assemble
    (:func:`_assembles`): the page is read again. Nothing in a part is trusted but its shape:
    the process that wrote it read the same hostile file."""
    if kept is None or kept.get("made_by.json") != fingerprint:
        return None
    try:
        record, text = json.loads(kept["record.json"]), kept["text.txt"].decode()
    except (KeyError, ValueError):
        return None
    escalated = record.get("escalation") if isinstance(record, dict) else None
    if (
        not isinstance(escalated, dict)
        or not isinstance(escalated.get("reason"), str)
        or record.get("page") != number
    ):
        return None
    paths: list[Path | None] = []
    for name, suffix in (("page.hocr", "hocr"), ("page.pdf", "pdf")):
        path = None
        if name in kept:
            path = work_dir / f"kept-{number}.{suffix}"
            path.write_bytes(kept[name])
        paths.append(path)
    page = (record, text, paths[0], paths[1])
    if not _assembles(page, params, work_dir):
        for path in paths:
            if path is not None:
                path.unlink()
        return None
    return page


def _assembles(page: KeptPage, params: dict, work_dir: Path) -> bool:
    """Whether a kept ``page`` makes every output ``params`` ask for as a page read now makes
    it: its hOCR and PDF page there exactly when asked, the outputs written from it alone (in a
    scratch directory, whatever that raises), and its PDF page one page."""
    record, text, hocr_path, pdf_path = page
    outputs = params["outputs"]
    if ("hocr" in outputs) != (hocr_path is not None) or ("searchable_pdf" in outputs) != (
        pdf_path is not None
    ):
        return False
    trial = Path(tempfile.mkdtemp(prefix="kept-", dir=work_dir))
    try:
        summary = job_summary([record], 1, params["languages"], "pdf")
        hocr = [(record["page"], hocr_path)] if hocr_path is not None else []
        pdf = [pdf_path] if pdf_path is not None else []
        for _output in write_outputs(outputs, trial, summary, [record], [text], hocr, pdf):
            pass
        return pdf_path is None or assemble.pdf_pages(pdf_path) == 1
    except Exception:  # a part that does not assemble is read again, whatever it raises
        return False
    finally:
        shutil.rmtree(trial, ignore_errors=True)
