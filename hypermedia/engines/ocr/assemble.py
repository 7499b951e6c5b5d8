"""Per-page OCR results merged into one document per output.

* **text**: the pages' texts joined by a form feed (U+000C), as ``text_extract`` does for PDFs.
* **hOCR**: one XHTML document: the head of the first page's file and every page's
  ``ocr_page`` element, in page order. Tesseract numbers the elements of each run from page 1
  (``page_1``, ``block_1_2``, ``line_1_3``, ``word_1_4``…): the page part of every id becomes the
  page's number, so ids stay unique; ``ppageno`` (hOCR's 0-based physical page number) becomes
  the page's, and the ``image`` property (the name of a temporary file) is dropped. hOCR 1.2
  (kba.github.io/hocr-spec/1.2): ``ppageno`` and ``image`` are optional properties of
  ``ocr_page``; ``bbox`` stays in pixels of the page image tesseract read.
* **searchable PDF**: tesseract's one-page PDFs (the page image with an invisible ``GlyphLessFont``
  text layer, text render mode 3) imported one after the other into a new document with PDFium
  (``FPDF_ImportPages`` through ``PdfDocument.import_pages``): no page is re-rendered or
  re-encoded.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pypdfium2 as pdfium

__all__ = ["EMPTY_HOCR", "PAGE_SEPARATOR", "join_text", "merge_hocr", "merge_pdfs"]

PAGE_SEPARATOR: Final = "\f"

_BODY_OPEN: Final = re.compile(r"<body[^>]*>")
_BODY_CLOSE: Final = "</body>"
_PAGE_ID: Final = re.compile(r"""(\bid=['"][a-z]+)_1(?=['"_])""")
_PAGE_TITLE: Final = re.compile(r"""(<div class=['"]ocr_page['"][^>]*?title=)(['"])(.*?)\2""")
_IMAGE_PROPERTY: Final = re.compile(r"""image "[^"]*";\s*""")
_PPAGENO: Final = re.compile(r"ppageno \d+")
EMPTY_HOCR: Final = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
    '    "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
    '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n <head>\n  <title></title>\n'
    '  <meta http-equiv="Content-Type" content="text/html;charset=utf-8"/>\n'
    "  <meta name='ocr-system' content='hypermedia'/>\n"
    "  <meta name='ocr-capabilities' content='ocr_page'/>\n </head>\n <body>\n </body>\n</html>\n"
)
"""The hOCR of a job none of whose pages was OCRed (every page skipped for its text layer)."""


def join_text(texts: Sequence[str]) -> str:
    """The pages' texts joined by :data:`PAGE_SEPARATOR` (none after the last page)."""
    return PAGE_SEPARATOR.join(texts)


def _page_body(document: str, number: int) -> str:
    """The part of a one-page tesseract hOCR document between ``<body>`` and ``</body>``, with ids
    and the page title rewritten for page ``number`` (1-based)."""
    opening = _BODY_OPEN.search(document)
    end = document.rfind(_BODY_CLOSE)
    if opening is None or end < opening.end():
        raise ValueError("not a tesseract hOCR document: no body")
    body = document[opening.end() : end]
    body = _PAGE_ID.sub(lambda m: f"{m.group(1)}_{number}", body)

    def title(match: re.Match[str]) -> str:
        value = _IMAGE_PROPERTY.sub("", match.group(3))
        value = _PPAGENO.sub(f"ppageno {number - 1}", value)
        return f"{match.group(1)}{match.group(2)}{value}{match.group(2)}"

    return _PAGE_TITLE.sub(title, body, count=1)


def merge_hocr(pages: Sequence[tuple[int, Path]]) -> str:
    """One hOCR document from tesseract's one-page documents.

    Args:
        pages: ``(page number, path of its .hocr)`` in page order.

    Returns:
        The merged XHTML (see the module docstring).

    Raises:
        ValueError: a file without ``<body>``.
    """
    if not pages:
        return EMPTY_HOCR
    documents = [(number, path.read_text(encoding="utf-8")) for number, path in pages]
    first = documents[0][1]
    opening = _BODY_OPEN.search(first)
    if opening is None:
        raise ValueError("not a tesseract hOCR document: no body")
    parts = [first[: opening.end()]]
    parts.extend(_page_body(document, number).rstrip() for number, document in documents)
    parts.append(f"\n {_BODY_CLOSE}\n</html>\n")
    return "".join(parts)


_CREATION_DATE = re.compile(rb"/CreationDate ?\(D:(\d{14})")
_FILE_ID = re.compile(rb"/ID ?\[ ?<([0-9A-Fa-f]{32})> ?<([0-9A-Fa-f]{32})> ?\]")
_INFO = re.compile(rb"/Info (\d+) 0 R")


def reproducible_pdf(data: bytes) -> bytes:
    """``data``, a PDF PDFium saved, with the two things that made each save differ made
    deterministic, byte for byte in place (same lengths, so every offset stays right): the
    creation time PDFium stamps in the document's Info dictionary (1970-01-01 00:00:00 instead)
    and the file identifier it draws in the trailer (the first 128 bits of SHA-256 over the file
    with that identifier blanked). Only those two places are touched: a page imported from the
    user's PDF keeps its bytes. The same pages then give the same bytes, in any attempt or job
    (ADR 0069). A file without a ``trailer`` (an xref stream) is returned as it is."""
    trailer = data.rfind(b"trailer")
    if trailer < 0:
        return data
    info = _INFO.search(data, trailer)
    start = data.find(b"\n%d 0 obj" % int(info.group(1))) if info else -1
    if start >= 0:
        end = data.find(b"endobj", start)
        found = _CREATION_DATE.search(data, start, end)
        if found is not None:
            data = data[: found.start(1)] + b"19700101000000" + data[found.end(1) :]
    found = _FILE_ID.search(data, trailer)
    if found is None:
        return data
    cut = [(found.start(1), found.end(1)), (found.start(2), found.end(2))]
    blank = data[: cut[0][0]] + b"0" * 32 + data[cut[0][1] : cut[1][0]] + b"0" * 32 + data[cut[1][1] :]
    digest = hashlib.sha256(blank).hexdigest()[:32].upper().encode()
    return data[: cut[0][0]] + digest + data[cut[0][1] : cut[1][0]] + digest + data[cut[1][1] :]


def pdf_pages(path: Path) -> int:
    """The pages of the PDF at ``path``. Raises pypdfium2.PdfiumError for one PDFium cannot read."""
    document = pdfium.PdfDocument(str(path))
    try:
        return len(document)
    finally:
        document.close()


def merge_pdfs(paths: Sequence[Path], target: Path) -> int:
    """Writes the pages of ``paths``, in order, into one PDF at ``target``, the same bytes for the
    same pages (:func:`reproducible_pdf`).

    Returns:
        The number of pages written.

    Raises:
        ValueError: no paths.
        pypdfium2.PdfiumError: a file PDFium cannot read (tesseract's own output: a bug).
    """
    if not paths:
        raise ValueError("no pages to merge")
    merged = pdfium.PdfDocument.new()
    try:
        for path in paths:
            page_pdf = pdfium.PdfDocument(str(path))
            try:
                merged.import_pages(page_pdf)
            finally:
                page_pdf.close()
        buffer = io.BytesIO()
        merged.save(buffer)
        target.write_bytes(reproducible_pdf(buffer.getvalue()))
        return len(merged)
    finally:
        merged.close()
