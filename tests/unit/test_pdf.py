"""The PDF operations (hypermedia.engines.documents) on the real corpus files and on PDFs made here, run
the way the docworker runs them: in real sandbox children forked from a zygote that has imported
pyvips and pypdfium2, with real rlimits. Outputs are checked by decoding them and comparing with
PDFium renders made in this process. The builders it shares with other tests are in
``tests/helpers/pdf.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
import pyvips

from hypermedia.core.errors import CpuTimeExceeded, InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.documents import engine_process
from hypermedia.engines.documents.params import MAX_PREVIEW_PAGES, parse_pages, validate_params
from hypermedia.engines.documents.pdf import DocumentLimits
from hypermedia.sandbox import Sandbox, SandboxLimits, SandboxResult
from tests.helpers.pdf import (
    LETTER,
    PDF_DIR,
    SANDBOX_LIMITS,
    _stream,
    build_pdf,
    field_rect,
    filled_forms_pdf,
    ink,
    mean_abs_diff,
    one_page_pdf,
    pdf_deeply_nested,
    pdf_flate_bomb,
    pdf_with_pages,
    pixel_box,
    reference_render,
    run_job,
    text_pages_pdf,
)

THIS = "tests.unit.test_pdf"
A4 = (595.28, 841.89)


# --- PDFs made by the tests --------------------------------------------------------------------------


# A black square at the lower left and a red one at the upper right of a 200 × 100 pt page.
MARKED_CONTENT = b"0 0 0 rg 0 0 50 50 re f 1 0 0 rg 150 50 50 50 re f"


def _rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


_PASSWORD_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def encrypted_pdf_with_empty_user_password(text: str, producer: str, owner: str = "owner") -> bytes:
    """A one-page PDF encrypted by the standard security handler, revision 2 (40-bit RC4; PDF
    32000-1:2008 §7.6.3.3, algorithms 1–4) with an empty user password: any reader opens it
    without asking, yet its content stream and strings are encrypted."""
    permissions = -4
    file_id = hashlib.md5(b"hypermedia test").digest()
    owner_key = hashlib.md5((owner.encode() + _PASSWORD_PAD)[:32]).digest()[:5]
    o_entry = _rc4(owner_key, _PASSWORD_PAD)  # the user password is empty: just the padding
    key = hashlib.md5(
        _PASSWORD_PAD + o_entry + permissions.to_bytes(4, "little", signed=True) + file_id
    ).digest()[:5]
    u_entry = _rc4(key, _PASSWORD_PAD)

    def object_key(number: int) -> bytes:
        return hashlib.md5(key + number.to_bytes(3, "little") + (0).to_bytes(2, "little")).digest()[:10]

    content = _rc4(object_key(5), b"BT /F1 20 Tf 20 100 Td (%s) Tj ET" % text.encode("latin-1"))
    producer_enc = _rc4(object_key(6), producer.encode("latin-1"))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Count 1 /Kids [4 0 R] >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Resources << /Font << /F1 3 0 R >> >> /Contents 5 0 R >>",
        _stream(content),
        b"<< /Producer <%s> >>" % producer_enc.hex().encode(),
        b"<< /Filter /Standard /V 1 /R 2 /O <%s> /U <%s> /P %d >>"
        % (o_entry.hex().encode(), u_entry.hex().encode(), permissions),
    ]
    return build_pdf(
        objects,
        b"/Info 6 0 R /Encrypt 7 0 R /ID [<%s> <%s>]" % (file_id.hex().encode(), file_id.hex().encode()),
    )


# --- comparing images ----------------------------------------------------------------------------------


def redness(image: pyvips.Image, box: tuple[int, int, int, int]) -> int:
    """Pixels in ``box`` that are clearly red (R high, G and B low)."""
    region = image.crop(*box)
    r, g, b = region[0], region[1], region[2]
    red = (r > 160) & (g < 110) & (b < 110)
    return int(red.cast("uchar").avg() / 255 * box[2] * box[3] + 0.5)


# --- running jobs in the sandbox -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work_dir(tmp_root: Path) -> Path:
    path = tmp_root / f"pdf-{secrets.token_hex(4)}"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture(scope="module")
async def sandbox(work_dir: Path) -> AsyncIterator[Sandbox]:
    """A zygote like the docworker's (plus this module, for the engine-process test entries), with
    a uid per concurrent job as the docworker has one per slot: a document job has up to 6 tasks
    (the child, its engine process and libvips' threads while encoding), and ``RLIMIT_NPROC`` (16)
    counts them per uid, so four concurrent jobs on one shared uid would run out (measured:
    libvips then fails or crashes)."""
    uids = range(63000, 63004) if os.geteuid() == 0 else None  # apart from the platforms' 61000…
    box = Sandbox(
        work_dir, preload=("pyvips", "pypdfium2", "hypermedia.engines.documents.pdf", THIS), uid=uids
    )
    await box.start()
    yield box
    await box.close()


# --- fork safety -----------------------------------------------------------------------------------------


def test_pdfium_starts_no_thread_at_import_or_while_rendering() -> None:
    """What makes the zygote safe to fork: importing pypdfium2 initialises PDFium
    (FPDF_InitLibraryWithConfig) and neither that nor a render starts a thread."""
    script = (
        "import pypdfium2 as p\n"
        "t = lambda: int([l for l in open('/proc/self/status') if l.startswith('Threads')][0].split()[1])\n"
        "a = t()\n"
        f"d = p.PdfDocument({str(PDF_DIR / 'google-doc-document.pdf')!r}); d.init_forms()\n"
        "d[0].render(scale=2); d[0].get_textpage().get_text_bounded()\n"
        "print(a, t())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["1", "1"]


async def test_children_of_the_warm_zygote_render_in_parallel(sandbox: Sandbox) -> None:
    """Four children forked from the zygote that imported PDFium render at once, each its page."""
    jobs = await asyncio.gather(
        *(
            run_job(
                sandbox,
                "pdf_preview",
                PDF_DIR / "pdflatex-4-pages.pdf",
                {"pages": [n], "format": "png", "dpi": 36},
            )
            for n in (1, 2, 3, 4)
        )
    )
    for n, job in enumerate(jobs, start=1):
        assert job.error_code is None, job.result
        reference = reference_render(PDF_DIR / "pdflatex-4-pages.pdf", n - 1, 0.5)
        assert mean_abs_diff(job.image(f"preview_p{n}"), reference) < 0.5


# --- pdf_info ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pages", "size", "producer", "form_type"),
    [
        ("minimal-document.pdf", 1, A4, "pdfTeX-1.40.23", None),
        ("pdflatex-4-pages.pdf", 4, A4, "pdfTeX-1.40.23", None),
        ("multicolumn.pdf", 3, A4, "pdfTeX-1.40.21", None),
        ("pdflatex-forms.pdf", 1, LETTER, "pdfTeX-1.40.23", "acroform"),
        ("google-doc-document.pdf", 1, (596.0, 842.0), "Skia/PDF m103 Google Docs Renderer", None),
    ],
)
async def test_pdf_info_of_the_corpus(
    sandbox: Sandbox, name: str, pages: int, size: tuple[float, float], producer: str, form_type: str | None
) -> None:
    job = await run_job(sandbox, "pdf_info", PDF_DIR / name)
    assert job.error_code is None, job.result
    output, _ = job.output("info")
    info = job.json("info")
    assert output.mime_type == "application/json" and output.filename == "info.json"
    assert info["page_count"] == pages
    assert [(p["page"], p["width"], p["height"]) for p in info["pages"]] == [
        (n, *size) for n in range(1, pages + 1)
    ]
    assert info["producer"] == producer
    assert info["encrypted"] is False
    assert info["has_text_layer"] is True
    assert (info["has_forms"], info["form_type"]) == (form_type is not None, form_type)
    summary = {k: v for k, v in info.items() if k != "pages"}
    assert output.metadata == {**summary, "size_bytes": len(job.files["info.json"])}


async def test_pdf_info_of_an_encrypted_pdf_with_an_empty_user_password(sandbox: Sandbox) -> None:
    data = encrypted_pdf_with_empty_user_password("Encrypted hello", "Secret Producer 1.0")
    assert b"Encrypted hello" not in data and b"Secret Producer" not in data
    info = (await run_job(sandbox, "pdf_info", data)).json("info")
    assert info["encrypted"] is True
    assert info["producer"] == "Secret Producer 1.0"
    assert info["page_count"] == 1 and info["has_text_layer"] is True
    text = await run_job(sandbox, "text_extract", data)
    assert text.output("text")[1].decode().strip() == "Encrypted hello"


async def test_pdf_info_and_text_of_a_pdf_without_a_text_layer(sandbox: Sandbox) -> None:
    """A drawn page only (what a scan is to PDFium): has_text_layer false, so a client can ask for OCR."""
    data = one_page_pdf(b"/MediaBox [0 0 200 100]", MARKED_CONTENT)
    info = (await run_job(sandbox, "pdf_info", data)).json("info")
    assert (info["page_count"], info["has_text_layer"]) == (1, False)
    job = await run_job(sandbox, "text_extract", data)
    assert job.json("text_json") == {
        "page_count": 1,
        "has_text_layer": False,
        "chars": 0,
        "pages": [{"page": 1, "text": "", "chars": 0}],
    }
    assert job.output("text")[0].metadata["has_text_layer"] is False


# --- pdf_preview -------------------------------------------------------------------------------------------


async def test_a_preview_of_page_n_is_page_n(sandbox: Sandbox) -> None:
    source = PDF_DIR / "pdflatex-4-pages.pdf"
    job = await run_job(sandbox, "pdf_preview", source, {"pages": "1-4", "format": "png", "dpi": 72})
    assert job.error_code is None, job.result
    assert [o.output_type for o in job.result.outputs] == [
        "preview_p1",
        "preview_p2",
        "preview_p3",
        "preview_p4",
    ]
    references = [reference_render(source, i, 1.0) for i in range(4)]
    for n in range(1, 5):
        output, _ = job.output(f"preview_p{n}")
        image = job.image(f"preview_p{n}")
        assert output.mime_type == "image/png"
        assert output.metadata == {
            "page": n,
            "width": 596,
            "height": 842,
            "format": "png",
            "size_bytes": len(job.files[output.filename]),
            "page_count": 4,
            "resumed": False,
        }
        distances = [mean_abs_diff(image, reference) for reference in references]
        assert distances[n - 1] < 0.5, distances  # PNG is lossless: the same pixels
        assert min(d for i, d in enumerate(distances) if i != n - 1) > 5, distances


async def test_preview_formats_width_and_no_metadata(sandbox: Sandbox) -> None:
    source = PDF_DIR / "google-doc-document.pdf"
    reference = reference_render(source, 0, 400 / 596)
    for output_format, mime, loader, tolerance in (
        ("webp", "image/webp", "webpload", 4.0),
        ("jpeg", "image/jpeg", "jpegload", 4.0),
        ("png", "image/png", "pngload", 0.5),
    ):
        job = await run_job(sandbox, "pdf_preview", source, {"width": 400, "format": output_format})
        assert job.error_code is None, job.result
        output, _ = job.output("preview_p1")
        image = job.image("preview_p1")
        assert output.mime_type == mime and image.get("vips-loader").startswith(loader)
        assert (
            (image.width, image.height) == (400, 566) == (output.metadata["width"], output.metadata["height"])
        )
        assert image.bands == 3 and image.interpretation == "srgb"
        assert not {"exif-data", "xmp-data", "icc-profile-data", "iptc-data"} & set(image.get_fields())
        assert mean_abs_diff(image, reference) < tolerance, output_format


async def test_default_preview_is_page_1_as_webp_at_96_dpi(sandbox: Sandbox) -> None:
    job = await run_job(sandbox, "pdf_preview", PDF_DIR / "multicolumn.pdf")
    assert [o.output_type for o in job.result.outputs] == ["preview_p1"]
    image = job.image("preview_p1")
    assert image.get("vips-loader").startswith("webpload")
    assert (image.width, image.height) == (794, 1123)  # A4 at 96 dpi, rounded up
    assert mean_abs_diff(image, reference_render(PDF_DIR / "multicolumn.pdf", 0, 96 / 72)) < 4


async def test_preview_draws_form_fields_and_their_values(sandbox: Sandbox) -> None:
    scale = 2.0
    source = PDF_DIR / "pdflatex-forms.pdf"
    page_height = LETTER[1]
    empty = (await run_job(sandbox, "pdf_preview", source, {"format": "png", "dpi": 144})).image("preview_p1")
    # The fields' appearances (hyperref draws red borders) exist only when forms are drawn.
    name_box = pixel_box(field_rect(source.read_bytes(), 0), page_height, scale)
    without_forms = reference_render(source, 0, scale)
    assert redness(empty, name_box) > 100
    assert redness(without_forms, name_box) == 0
    assert mean_abs_diff(empty, reference_render(source, 0, scale, forms=True)) < 0.5

    # Filled in: the typed name and the check mark are visible inside their fields.
    filled = filled_forms_pdf()
    job = await run_job(sandbox, "pdf_preview", filled, {"format": "png", "dpi": 144})
    image = job.image("preview_p1")
    inner = (name_box[0] + 4, name_box[1] + 4, name_box[2] - 8, name_box[3] - 8)
    check_box = pixel_box(field_rect(filled, 1), page_height, scale)
    check_inner = (check_box[0] + 4, check_box[1] + 4, check_box[2] - 8, check_box[3] - 8)
    assert ink(image, inner) > 150, "the name typed into the field is drawn"
    assert ink(empty, inner) == 0 and ink(reference_render(filled, 0, scale), inner) == 0
    assert ink(image, check_inner) > 20 and ink(empty, check_inner) == 0
    info = (await run_job(sandbox, "pdf_info", filled)).json("info")
    assert info["has_forms"] is True


async def test_preview_honours_rotate_and_cropbox(sandbox: Sandbox) -> None:
    plain = one_page_pdf(b"/MediaBox [0 0 200 100]", MARKED_CONTENT)
    rotated = one_page_pdf(b"/MediaBox [0 0 200 100] /Rotate 90", MARKED_CONTENT)
    cropped = one_page_pdf(b"/MediaBox [0 0 200 100] /CropBox [100 0 200 100]", MARKED_CONTENT)
    params = {"format": "png", "dpi": 72}
    upright = (await run_job(sandbox, "pdf_preview", plain, params)).image("preview_p1")
    assert (upright.width, upright.height) == (200, 100)
    turned = (await run_job(sandbox, "pdf_preview", rotated, params)).image("preview_p1")
    assert (turned.width, turned.height) == (100, 200)
    assert mean_abs_diff(turned, upright.rot90()) == 0  # /Rotate 90 turns the page clockwise
    assert mean_abs_diff(turned, upright.rot270()) > 20
    right_half = (await run_job(sandbox, "pdf_preview", cropped, params)).image("preview_p1")
    assert (right_half.width, right_half.height) == (100, 100)
    assert mean_abs_diff(right_half, upright.crop(100, 0, 100, 100)) == 0
    info = (await run_job(sandbox, "pdf_info", rotated)).json("info")
    assert info["pages"] == [{"page": 1, "width": 100.0, "height": 200.0}]


async def test_a_huge_mediabox_is_refused_from_its_size_before_rendering(sandbox: Sandbox) -> None:
    # 14,400 pt square (200 in): 28,800 × 28,800 pixels at 144 dpi; its content would take long to fill.
    huge = one_page_pdf(b"/MediaBox [0 0 14400 14400]", b"0 0 0 rg 0 0 14400 14400 re f")
    started = time.monotonic()
    job = await run_job(sandbox, "pdf_preview", huge, {"dpi": 144})
    assert job.error_code == "PDF_PAGE_TOO_LARGE", job.result
    assert "28800 × 28800" in (job.result.error_message or "")
    assert time.monotonic() - started < 5 and job.result.peak_memory_mb < 300
    # Asked for a width instead, it is just a small picture.
    small = await run_job(sandbox, "pdf_preview", huge, {"width": 200, "format": "png"})
    assert small.error_code is None and small.image("preview_p1").width == 200
    # A tall, thin page: the width fits, the height does not.
    thin = one_page_pdf(b"/MediaBox [0 0 10 14400]", b"")
    tall = await run_job(sandbox, "pdf_preview", thin, {"width": 1000})
    assert tall.error_code == "PDF_PAGE_TOO_LARGE"


async def test_preview_pages_past_the_end_and_the_job_pixel_budget_are_invalid_params(
    sandbox: Sandbox,
) -> None:
    job = await run_job(sandbox, "pdf_preview", PDF_DIR / "pdflatex-4-pages.pdf", {"pages": [3, 5]})
    assert (job.error_code, job.result.outputs) == ("INVALID_PARAMS", [])
    assert job.result.error_message == "The PDF has 4 pages; page 5 does not exist."
    many = text_pages_pdf([f"page {n}" for n in range(1, 21)], media=b"[0 0 612 792]")
    over = await run_job(sandbox, "pdf_preview", many, {"pages": "1-20", "dpi": 600})
    assert over.error_code == "INVALID_PARAMS" and "in all" in (over.result.error_message or "")


# --- text_extract ------------------------------------------------------------------------------------------


async def test_text_extract_outputs_plain_text_and_json_per_page(sandbox: Sandbox) -> None:
    job = await run_job(sandbox, "text_extract", PDF_DIR / "pdflatex-4-pages.pdf")
    assert job.error_code is None, job.result
    text_output, text_bytes = job.output("text")
    json_output, _ = job.output("text_json")
    assert (text_output.mime_type, json_output.mime_type) == ("text/plain; charset=utf-8", "application/json")
    data = job.json("text_json")
    assert data["page_count"] == 4 and data["has_text_layer"] is True
    assert [p["page"] for p in data["pages"]] == [1, 2, 3, 4]
    assert all(p["chars"] == len(p["text"]) > 2000 for p in data["pages"])
    assert data["chars"] == sum(p["chars"] for p in data["pages"])
    plain = text_bytes.decode()
    assert plain.split("\f") == [p["text"] for p in data["pages"]]
    assert "\r" not in plain
    # Page N's text is page N's: compare with PDFium's text of each page.
    document = pdfium.PdfDocument(str(PDF_DIR / "pdflatex-4-pages.pdf"))
    for index, page in enumerate(data["pages"]):
        expected = document[index].get_textpage().get_text_bounded().replace("\r\n", "\n")
        assert page["text"] == expected
    assert data["pages"][0]["text"].startswith("Hello, here is some text without a meaning.")
    assert text_output.metadata == {
        "page_count": 4,
        "has_text_layer": True,
        "chars": data["chars"],
        "size_bytes": len(text_bytes),
    }


def _column_of_lines(source: Path, index: int, lines: list[str]) -> list[str]:
    """For each line of extracted text, ``L`` or ``R`` when it lies wholly in the left or right half
    of the page (by PDFium's text of each half), ``?`` for lines in neither (titles across both)."""
    page = pdfium.PdfDocument(str(source))[index]
    width, height = page.get_size()
    textpage = page.get_textpage()
    # As page_text gives it: PDFium's U+0002 (where it joined a word hyphenated at a line end)
    # and the other control characters dropped.
    controls = {c: None for c in range(0x20) if chr(c) not in "\t\n\f"}
    left = textpage.get_text_bounded(0, 0, width / 2, height).replace("\r\n", "\n").translate(controls)
    right = textpage.get_text_bounded(width / 2, 0, width, height).replace("\r\n", "\n").translate(controls)
    return [
        "L" if line in left and line not in right else "R" if line in right and line not in left else "?"
        for line in lines
    ]


async def test_multicolumn_text_comes_out_column_by_column(sandbox: Sandbox) -> None:
    source = PDF_DIR / "multicolumn.pdf"
    job = await run_job(sandbox, "text_extract", source)
    pages = job.json("text_json")["pages"]
    assert len(pages) == 3
    for index in (0, 1):  # the two pages of running two-column text
        lines = [line for line in pages[index]["text"].split("\n") if len(line) > 25]
        columns = "".join(c for c in _column_of_lines(source, index, lines) if c != "?")
        assert columns.count("L") > 10 and columns.count("R") > 10, columns
        # Every line of the left column comes before every line of the right one.
        assert columns == "L" * columns.count("L") + "R" * columns.count("R"), columns
    page1 = pages[0]["text"]
    # The left column runs into the right one: its last line, then the right column's first.
    assert "Donec nonummy\npellentesque ante. Phasellus adipiscing semper elit." in page1
    assert (
        page1.index("Nulla malesuada porttitor diam")
        < page1.index("pellentesque ante")
        < page1.index("Quisque ullamcorper placerat ipsum")
    )


# --- encrypted, damaged and hostile PDFs --------------------------------------------------------------------


async def test_password_protected_pdf(sandbox: Sandbox) -> None:
    source = PDF_DIR / "libreoffice-writer-password.pdf"
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        job = await run_job(sandbox, operation, source)
        assert (job.error_code, job.result.retryable, job.result.outputs) == ("PASSWORD_REQUIRED", False, [])
    wrong = await run_job(sandbox, "pdf_info", source, password="wrong")
    assert wrong.error_code == "PASSWORD_INCORRECT"
    # The engine opens it with the user password (the API does not pass one yet: see params).
    opened = await run_job(sandbox, "text_extract", source, password="openpassword")
    assert opened.error_code is None, opened.result
    data = opened.json("text_json")
    assert data["page_count"] == 1 and data["pages"][0]["text"].startswith("Lorem ipsum dolor sit amet")
    preview = await run_job(
        sandbox, "pdf_preview", source, {"format": "png", "dpi": 36}, password="openpassword"
    )
    assert preview.error_code is None
    info = (await run_job(sandbox, "pdf_info", source, password="openpassword")).json("info")
    assert info["encrypted"] is True and info["producer"] == "LibreOffice 6.4"


async def test_damaged_pdfs(sandbox: Sandbox) -> None:
    original = (PDF_DIR / "minimal-document.pdf").read_bytes()
    # A wrong startxref offset: PDFium rebuilds the cross-reference table by scanning the file.
    cut = original.rindex(b"startxref")
    broken_xref = original[:cut] + b"startxref\n999999\n%%EOF\n"
    recovered = await run_job(sandbox, "text_extract", broken_xref)
    assert recovered.error_code is None, recovered.result
    assert recovered.json("text_json")["pages"][0]["text"].startswith("Lorem ipsum dolor sit amet")
    for damaged in (original[: len(original) // 2], b"%PDF-1.7\n" + bytes(range(256)) * 40):
        job = await run_job(sandbox, "pdf_info", damaged)
        assert (job.error_code, job.result.retryable) == ("PARSE_ERROR", False)
        assert job.result.error_message == "The PDF is damaged and cannot be read."
    not_pdf = await run_job(sandbox, "pdf_info", b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    assert not_pdf.error_code == "UNSUPPORTED_FORMAT"
    too_big = await run_job(
        sandbox, "pdf_info", original, doc_limits=DocumentLimits(max_input_bytes=1000, max_page_pixels=10**6)
    )
    assert too_big.error_code == "INPUT_TOO_LARGE"


async def test_page_count_bomb_is_refused_before_any_page_is_loaded(sandbox: Sandbox) -> None:
    bomb = pdf_with_pages(50_000)
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        job = await run_job(sandbox, operation, bomb)
        assert job.error_code == "PDF_PAGE_LIMIT", job.result
        assert job.result.error_message == "The PDF has 50000 pages; at most 10000 are processed."
        assert job.result.duration_ms < 5000


async def test_flate_bomb_ends_at_the_memory_limit_with_resource_limit(sandbox: Sandbox) -> None:
    """Its content stream inflates to 1 GiB: PDFium aborts when the next buffer cannot be mapped
    under the 2 GiB RLIMIT_AS; the engine process reports it as RESOURCE_LIMIT."""
    bomb = pdf_flate_bomb()
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        job = await run_job(sandbox, operation, bomb)
        assert (job.error_code, job.result.retryable) == ("RESOURCE_LIMIT", False), job.result
        assert job.result.error_message == "The job exceeded its memory limit."
        assert 512 < job.result.peak_memory_mb < 2048
        assert job.result.duration_ms < 15000


async def test_deeply_nested_pdf_is_read_as_a_blank_page(sandbox: Sandbox) -> None:
    """100,000 nested arrays in the page dictionary: PDFium's parser stops at its depth limit and
    the page is an empty page; nothing crashes."""
    nested = pdf_deeply_nested()
    info = await run_job(sandbox, "pdf_info", nested)
    assert info.error_code is None and info.json("info")["page_count"] == 1
    preview = await run_job(sandbox, "pdf_preview", nested, {"format": "png", "dpi": 18})
    image = preview.image("preview_p1")
    assert (image.width, image.height) == (153, 198) and image.min() == 255  # white
    text = await run_job(sandbox, "text_extract", nested)
    assert text.json("text_json")["has_text_layer"] is False


# --- the engine process -------------------------------------------------------------------------------------


def entry_engine(operation: str, params: dict, input_path: Path, out_dir: Path, **_: Any) -> list[OutputFile]:
    """A sandbox entry that runs ``_engine_<operation>`` through :func:`engine_process.call` and
    writes what it returned, with its own pid, to ``result.json``."""
    value = engine_process.call(globals()[f"_engine_{operation}"], params)
    (out_dir / "result.json").write_text(json.dumps({"value": value, "entry_pid": os.getpid()}))
    return [OutputFile("result", "result.json", "application/json", {})]


def _engine_value(params: dict) -> Any:
    return {"engine_pid": os.getpid(), "list": [1, "two"]}


def _engine_domain(params: dict) -> Any:
    raise PermanentJobError("Specific failure.", "SPECIFIC_CODE")


def _engine_out_of_time(params: dict) -> Any:
    """As an engine whose own process (a tesseract) ran out of the job's CPU time."""
    raise CpuTimeExceeded()


def _engine_abort(params: dict) -> Any:
    held = b"\x01" * (params["mib"] << 20)  # resident, not just reserved
    os.abort()
    return len(held)


def _engine_spin(params: dict) -> Any:
    while True:
        pass


def _engine_fail(params: dict) -> Any:
    raise ValueError("a bug in the engine")


async def _run_engine_entry(
    box: Sandbox, operation: str, params: dict, limits: SandboxLimits = SANDBOX_LIMITS
) -> tuple[SandboxResult, Any]:
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = box.prepare(job_id)
    try:
        result = await box.run(
            job_id, f"{THIS}:entry_engine", operation, params, job_dir / "input" / "none", limits
        )
        written = json.loads((job_dir / "output" / "result.json").read_text()) if result.outputs else None
        return result, written
    finally:
        box.cleanup(job_id)


async def test_engine_process_turns_deaths_into_specific_codes(sandbox: Sandbox) -> None:
    ok, written = await _run_engine_entry(sandbox, "value", {})
    assert ok.error_code is None, ok
    assert written["value"]["list"] == [1, "two"] and written["value"]["engine_pid"] != written["entry_pid"]
    domain, _ = await _run_engine_entry(sandbox, "domain", {})
    assert (domain.error_code, domain.error_message, domain.retryable) == (
        "SPECIFIC_CODE",
        "Specific failure.",
        False,
    )
    big_abort, _ = await _run_engine_entry(sandbox, "abort", {"mib": 700})
    assert (big_abort.error_code, big_abort.retryable) == ("RESOURCE_LIMIT", False), big_abort
    assert big_abort.peak_memory_mb >= 700
    small_abort, _ = await _run_engine_entry(sandbox, "abort", {"mib": 1})
    assert (small_abort.error_code, small_abort.retryable) == ("SANDBOX_CRASHED", False), small_abort
    spin, _ = await _run_engine_entry(
        sandbox,
        "spin",
        {},
        SandboxLimits(cpu_seconds=1, wall_seconds=10, memory_bytes=2 << 30, fsize_bytes=1 << 20),
    )
    # The job's CPU limit, met in its engine process: charged as the input's (ADR 0084).
    assert (spin.error_code, spin.retryable, spin.killed) == ("TIMEOUT", True, "cpu_time"), spin
    assert spin.duration_ms < 5000
    out_of_time, _ = await _run_engine_entry(sandbox, "out_of_time", {})
    assert (out_of_time.error_code, out_of_time.killed) == ("TIMEOUT", "cpu_time"), out_of_time
    bug, _ = await _run_engine_entry(sandbox, "fail", {})
    assert (bug.error_code, bug.error_message) == ("INTERNAL", "Internal error.")


# --- params --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "pages"),
    [
        (None, [1]),
        ([3, 1, 3], [1, 3]),
        ("2", [2]),
        ("1-3", [1, 2, 3]),
        (" 1 - 3 , 7,5 ", [1, 2, 3, 5, 7]),
        ("1-20", list(range(1, 21))),
        ("9990-10000", list(range(9990, 10001))),
    ],
)
def test_pages_are_parsed(value: Any, pages: list[int]) -> None:
    assert parse_pages(value) == pages


@pytest.mark.parametrize(
    "value",
    [
        [],
        [0],
        [True],
        [1.0],
        ["1"],
        "",
        "0",
        "3-1",
        "1-21",
        "1-1000000000",
        "1,2,x",
        "1-3,5-22",
        5,
        {"1": 2},
        "10001",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: a Unicode digit, not a page number
        "\uff11-\uff12",  # FULLWIDTH DIGIT ONE - TWO
    ],
)
def test_bad_pages_are_invalid_params(value: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_pages(value)
    assert err.value.error_code == "INVALID_PARAMS"


def test_params_are_normalised() -> None:
    assert validate_params("pdf_info", None) == {} == validate_params("text_extract", {})
    assert validate_params("pdf_preview", {}) == {"pages": [1], "format": "webp", "dpi": 96}
    assert validate_params("pdf_preview", {"pages": "2-3", "width": 640, "format": "jpeg"}) == {
        "pages": [2, 3],
        "format": "jpeg",
        "width": 640,
    }
    assert validate_params("pdf_preview", {"dpi": None, "width": None, "format": None}) == {
        "pages": [1],
        "format": "webp",
        "dpi": 96,
    }
    assert len(validate_params("pdf_preview", {"pages": list(range(1, 21))})["pages"]) == MAX_PREVIEW_PAGES


@pytest.mark.parametrize(
    ("operation", "params", "code", "fragment"),
    [
        ("pdf_preview", {"width": 640, "dpi": 150}, "INVALID_PARAMS", "not both"),
        ("pdf_preview", {"width": 15}, "INVALID_PARAMS", "between 16 and 4096"),
        ("pdf_preview", {"dpi": 601}, "INVALID_PARAMS", "between 18 and 600"),
        ("pdf_preview", {"dpi": 150.0}, "INVALID_PARAMS", "integer"),
        ("pdf_preview", {"format": "avif"}, "INVALID_PARAMS", "webp, png, jpeg"),
        ("pdf_preview", {"size": 100}, "INVALID_PARAMS", "unknown params"),
        ("pdf_info", {"pages": [1]}, "INVALID_PARAMS", "unknown params"),
        ("text_extract", {"password": "openpassword"}, "INVALID_PARAMS", "password is not accepted"),
        ("pdf_preview", {"password": ""}, "INVALID_PARAMS", "password is not accepted"),
        ("pdf_preview", [1], "INVALID_PARAMS", "object"),
        ("docx_to_pdf", {}, "UNKNOWN_OPERATION", "unknown operation"),
        ("office_to_pdf", {"format": "pdf"}, "INVALID_PARAMS", "unknown params"),
    ],
)
def test_bad_params(operation: str, params: Any, code: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_params(operation, params)
    assert err.value.error_code == code
    assert fragment in err.value.public_message
    assert "openpassword" not in err.value.public_message
