"""PDFs the tests build, and the pixel measures they check renders with."""

from __future__ import annotations

import ctypes
import io
import json
import os
import secrets
import shutil
import zlib
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pyvips

from hypermedia.engines.contract import OutputFile
from hypermedia.engines.documents.pdf import DocumentLimits
from hypermedia.sandbox import Sandbox, SandboxLimits, SandboxResult

PDF_DIR = Path(__file__).resolve().parents[1] / "data" / "pdf"
ENTRY = "hypermedia.engines.documents.pdf:run"
SANDBOX_LIMITS = SandboxLimits(cpu_seconds=30, wall_seconds=45, memory_bytes=2 << 30, fsize_bytes=1 << 30)
"""The seeded document profiles' limits: RLIMIT_AS 2048 MiB."""


DOC_LIMITS = DocumentLimits(max_input_bytes=100 << 20, max_page_pixels=40_000_000)
LETTER = (612.0, 792.0)


def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def one_page_pdf(page: bytes, content: bytes) -> bytes:
    """A one-page PDF: ``page`` goes into the page dictionary (MediaBox, Rotate, CropBox …)."""
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R " + page + b" /Contents 4 0 R >>",
            _stream(content),
        ]
    )


def text_pages_pdf(texts: list[str], media: bytes = b"[0 0 300 200]") -> bytes:
    """One page per text, Helvetica 20 pt (a standard font: no font file needed)."""
    count = len(texts)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Count %d /Kids [%s] >>"
        % (count, b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(count))),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(texts):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox %s /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
            % (media, 5 + 2 * i)
        )
        objects.append(_stream(b"BT /F1 20 Tf 20 100 Td (%s) Tj ET" % text.encode("latin-1")))
    return build_pdf(objects)


FILLED_NAME = "Ada Lovelace"


def filled_forms_pdf() -> bytes:
    """``pdflatex-forms.pdf`` with its form filled in the way a viewer fills it (PDFium's form
    filler: text typed into ``Name``, a click on ``Check``), saved: the values and their
    regenerated appearance streams are in the file."""
    document = pdfium.PdfDocument(str(PDF_DIR / "pdflatex-forms.pdf"))
    document.init_forms()
    page = document[0]
    name_field = pdfium_c.FPDFPage_GetAnnot(page, 0)
    assert pdfium_c.FORM_SetFocusedAnnot(document.formenv, name_field)
    typed = (FILLED_NAME + "\0").encode("utf-16-le")
    buffer = ctypes.create_string_buffer(typed, len(typed))
    pdfium_c.FORM_ReplaceSelection(document.formenv, page, ctypes.cast(buffer, pdfium_c.FPDF_WIDESTRING))
    pdfium_c.FORM_ForceToKillFocus(document.formenv)
    check_box = pdfium_c.FPDFPage_GetAnnot(page, 1)
    rect = pdfium_c.FS_RECTF()
    pdfium_c.FPDFAnnot_GetRect(check_box, rect)
    x, y = (rect.left + rect.right) / 2, (rect.bottom + rect.top) / 2
    pdfium_c.FORM_OnLButtonDown(document.formenv, page, 0, x, y)
    pdfium_c.FORM_OnLButtonUp(document.formenv, page, 0, x, y)
    pdfium_c.FORM_ForceToKillFocus(document.formenv)
    for annot in (name_field, check_box):
        pdfium_c.FPDFPage_CloseAnnot(annot)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def field_rect(data: bytes, index: int) -> tuple[float, float, float, float]:
    """(left, bottom, right, top) of the page-1 annotation ``index``, in points."""
    document = pdfium.PdfDocument(data)
    annot = pdfium_c.FPDFPage_GetAnnot(document[0], index)
    rect = pdfium_c.FS_RECTF()
    pdfium_c.FPDFAnnot_GetRect(annot, rect)
    pdfium_c.FPDFPage_CloseAnnot(annot)
    return rect.left, rect.bottom, rect.right, rect.top


def reference_render(source: Path | bytes, index: int, scale: float, *, forms: bool = False) -> pyvips.Image:
    """A direct PDFium render of page ``index`` (0-based) in this process, as an sRGB image."""
    document = pdfium.PdfDocument(str(source) if isinstance(source, Path) else source)
    if forms:
        document.init_forms()
    bitmap = document[index].render(scale=scale, rev_byteorder=True, prefer_bgrx=True, may_draw_forms=forms)
    image = pyvips.Image.new_from_memory(bytes(bitmap.buffer), bitmap.width, bitmap.height, 4, "uchar")
    return image.extract_band(0, n=3).copy(interpretation="srgb")


def mean_abs_diff(a: pyvips.Image, b: pyvips.Image) -> float:
    """Mean absolute difference (0–255) of the first three bands of two same-sized images."""
    assert (a.width, a.height) == (b.width, b.height), ((a.width, a.height), (b.width, b.height))
    return float((a.extract_band(0, n=3).cast("float") - b.extract_band(0, n=3).cast("float")).abs().avg())


def ink(image: pyvips.Image, box: tuple[int, int, int, int]) -> int:
    """Pixels darker than mid-grey in ``box`` (left, top, width, height) of an RGB image."""
    grey = image.crop(*box).colourspace("b-w")
    return int((grey < 128).cast("uchar").avg() / 255 * box[2] * box[3] + 0.5)


def pixel_box(
    rect: tuple[float, float, float, float], page_height: float, scale: float
) -> tuple[int, int, int, int]:
    """An annotation's rectangle (PDF points, y up) as a pixel box (y down) at ``scale``."""
    left, bottom, right, top = rect
    return (
        int(left * scale),
        int((page_height - top) * scale),
        int((right - left) * scale) + 1,
        int((top - bottom) * scale) + 1,
    )


class Job:
    """One finished sandboxed job: its result and its output files (read before cleanup)."""

    def __init__(self, result: SandboxResult, files: dict[str, bytes]) -> None:
        self.result = result
        self.files = files

    @property
    def error_code(self) -> str | None:
        return self.result.error_code

    def output(self, output_type: str) -> tuple[OutputFile, bytes]:
        (found,) = [o for o in self.result.outputs if o.output_type == output_type]
        return found, self.files[found.filename]

    def json(self, output_type: str) -> Any:
        return json.loads(self.output(output_type)[1])

    def image(self, output_type: str) -> pyvips.Image:
        return pyvips.Image.new_from_buffer(self.output(output_type)[1], "")


async def run_job(
    box: Sandbox,
    operation: str,
    source: Path | bytes,
    params: dict | None = None,
    *,
    password: str | None = None,
    limits: SandboxLimits = SANDBOX_LIMITS,
    doc_limits: DocumentLimits = DOC_LIMITS,
    entry: str = ENTRY,
) -> Job:
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = box.prepare(job_id)
    input_path = job_dir / "input" / "source"
    if isinstance(source, Path):
        shutil.copy(source, input_path)
    else:
        input_path.write_bytes(source)
    os.chmod(input_path, 0o600)  # readable only once handed to the sandbox uid
    kwargs: dict[str, Any] = {"limits": doc_limits}
    if password is not None:
        kwargs["password"] = password
    try:
        result = await box.run(
            job_id, entry, operation, params or {}, input_path, limits, entry_kwargs=kwargs
        )
        files = {o.filename: (job_dir / "output" / o.filename).read_bytes() for o in result.outputs}
    finally:
        box.cleanup(job_id)
    return Job(result, files)


def build_pdf(objects: list[bytes], trailer: bytes = b"") -> bytes:
    """A PDF with ``objects`` as objects 1…n (object 1 the catalog), a correct xref table and
    ``trailer`` added to the trailer dictionary."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % offset for offset in offsets)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R %s >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, trailer, xref)
    )
    return out.getvalue()


def pdf_with_pages(count: int) -> bytes:
    """A real ``count``-page PDF: catalog, one page tree node, ``count`` distinct page objects."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(count))
    pages = [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * count
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count %d /Kids [%s] >>" % (count, kids),
            *pages,
        ]
    )


def pdf_flate_bomb(inflated: int = 1 << 30) -> bytes:
    """A one-page PDF whose content stream inflates to ``inflated`` bytes of zeros (≈ 1 MiB
    compressed: one full-flush DEFLATE block of 1 MiB of zeros, repeated)."""
    chunk = b"\0" * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw DEFLATE: the zlib frame is ours
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = inflated // len(chunk)
    checksum = 1
    for _ in range(count):
        checksum = zlib.adler32(chunk, checksum)
    # RFC 1950 header (deflate, 32 KiB window, level 9), the blocks, a final empty block, Adler-32.
    stream = b"\x78\xda" + block * count + compressor.flush() + checksum.to_bytes(4, "big")
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        ]
    )


def pdf_deeply_nested(depth: int = 100_000) -> bytes:
    """A PDF whose page carries an array nested ``depth`` levels deep (a recursive parser's stack)."""
    nested = b"[" * depth + b"]" * depth
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Junk " + nested + b" >>",
        ]
    )
