"""OCR checkpoints in the engine (ADR 0069): every page but the last is kept as a part, a kept
page is taken from its part instead of being read again, a damaged part is read again, and the
same pages give the same bytes (the searchable PDF included). Real tesseract, real PDFium."""

from __future__ import annotations

import hashlib
import io
import uuid
import zipfile
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from hypermedia.engines.contract import (
    CHECKPOINT_DIR,
    MAX_PART_BYTES,
    MAX_RESUMED_PART_BYTES,
    RESUME_DIR,
    keep_part,
    resumed_part,
    resumed_parts,
)
from hypermedia.engines.ocr.engine import run
from hypermedia.jobs.checkpoints import key_of
from services.storage.backends import OUTPUT_TYPE
from tests.helpers.ocr import LIMITS
from tests.helpers.pdf import text_pages_pdf

OUTPUTS = ["text", "words", "hocr", "searchable_pdf"]
TEXTS = ["Page 1 harbour", "Page 2 lantern", "Page 3 meadow"]


def _job_dir(root: Path) -> Path:
    (root / "output").mkdir(parents=True)
    return root


def _ocr(job_dir: Path, source: Path) -> dict[str, tuple[bytes, dict]]:
    outputs = run("ocr", {"outputs": OUTPUTS}, source, job_dir / "output", limits=LIMITS)
    return {o.output_type: ((job_dir / "output" / o.filename).read_bytes(), o.metadata) for o in outputs}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ocr-checkpoints") / "three.pdf"
    path.write_bytes(text_pages_pdf(TEXTS))
    return path


def test_every_page_but_the_last_is_kept_and_kept_pages_are_not_read_again(
    source: Path, tmp_path: Path
) -> None:
    first = _job_dir(tmp_path / "first")
    whole = _ocr(first, source)
    kept = sorted(p.name for p in (first / CHECKPOINT_DIR).iterdir())
    assert kept == ["page-00001.zip", "page-00002.zip"]
    assert whole["text"][1]["resumed_pages"] == []

    # The next attempt has both parts; page 2's text is changed, to see it taken, not read.
    second = _job_dir(tmp_path / "second")
    (second / RESUME_DIR).mkdir()
    (second / RESUME_DIR / "page-00001.zip").write_bytes(
        (first / CHECKPOINT_DIR / "page-00001.zip").read_bytes()
    )
    with zipfile.ZipFile(first / CHECKPOINT_DIR / "page-00002.zip") as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    assert set(files) == {"record.json", "text.txt", "page.hocr", "page.pdf", "made_by.json"}
    keep_part(second / "output", "page-00002", files | {"text.txt": b"FROM THE CHECKPOINT\n"})
    (second / CHECKPOINT_DIR / "page-00002.zip").rename(second / RESUME_DIR / "page-00002.zip")

    resumed = _ocr(second, source)
    pages = resumed["text"][0].decode().split("\f")
    assert pages[0] == whole["text"][0].decode().split("\f")[0]
    assert pages[1] == "FROM THE CHECKPOINT\n"
    assert "Page 3" in pages[2]
    assert resumed["text"][1]["resumed_pages"] == [1, 2]
    assert not list((second / CHECKPOINT_DIR).glob("*.zip")), "no page read again, so none kept again"
    assert (
        resumed["hocr"][0] == whole["hocr"][0] and resumed["searchable_pdf"][0] == whole["searchable_pdf"][0]
    )


def test_a_damaged_or_foreign_part_is_read_again(source: Path, tmp_path: Path) -> None:
    job = _job_dir(tmp_path / "job")
    (job / RESUME_DIR).mkdir()
    (job / RESUME_DIR / "page-00001.zip").write_bytes(b"not a zip at all")
    keep_part(
        job / "output",
        "page-00002",
        {"record.json": b'{"page": 7, "escalation": {"reason": "x"}}', "text.txt": b"x"},
    )
    (job / CHECKPOINT_DIR / "page-00002.zip").rename(job / RESUME_DIR / "page-00002.zip")
    result = _ocr(job, source)
    assert result["text"][1]["resumed_pages"] == []
    assert [("Page 1" in p, "Page 2" in p) for p in result["text"][0].decode().split("\f")[:2]] == [
        (True, False),
        (False, True),
    ]


def test_the_same_pages_give_the_same_searchable_pdf_bytes(source: Path, tmp_path: Path) -> None:
    """PDFium stamps each save with its time and a random file id; the merge makes both
    deterministic, and the file still opens with every page and its text layer."""
    runs = [_ocr(_job_dir(tmp_path / name), source)["searchable_pdf"][0] for name in ("a", "b")]
    assert hashlib.sha256(runs[0]).digest() == hashlib.sha256(runs[1]).digest()
    document = pdfium.PdfDocument(io.BytesIO(runs[0]).getvalue())
    try:
        assert len(document) == 3
        assert "harbour" in document[0].get_textpage().get_text_range()
    finally:
        document.close()


def test_part_names_and_files_are_checked(tmp_path: Path) -> None:
    out_dir = _job_dir(tmp_path / "job") / "output"
    # 13 characters would make the key's last segment, checkpoint-{job_id}-{part}.zip, longer
    # than the 64 storage takes (its upload would be refused after the part was recorded).
    for bad in ("", "Page-1", "../x", "a/b", "x" * 13, "x" * 65):
        with pytest.raises(ValueError, match="bad part name"):
            keep_part(out_dir, bad, {"a": b"1"})
        assert resumed_part(out_dir, bad) is None
    assert resumed_part(out_dir, "page-00001") is None
    keep_part(out_dir, "page-00001", {"b": b"2", "a": b"1"})
    (tmp_path / "job" / RESUME_DIR).mkdir()
    (tmp_path / "job" / CHECKPOINT_DIR / "page-00001.zip").rename(
        tmp_path / "job" / RESUME_DIR / "page-00001.zip"
    )
    assert resumed_part(out_dir, "page-00001") == {"a": b"1", "b": b"2"}
    assert resumed_parts(out_dir) == ["page-00001"]
    key = key_of("derived/pool/obj/1/", str(uuid.uuid4()), "x" * 12)
    assert OUTPUT_TYPE.match(key.rsplit("/", 1)[1])


def test_a_part_that_unpacks_to_more_than_its_bound_is_not_read(tmp_path: Path) -> None:
    """Each file under MAX_PART_BYTES, the whole far over MAX_RESUMED_PART_BYTES (zeros pack to
    nothing): the part is done again rather than read into the child's memory."""
    out_dir = _job_dir(tmp_path / "job") / "output"
    (tmp_path / "job" / RESUME_DIR).mkdir()
    big = b"\0" * (MAX_PART_BYTES // 2)
    with zipfile.ZipFile(
        tmp_path / "job" / RESUME_DIR / "page-00001.zip", "w", zipfile.ZIP_DEFLATED
    ) as archive:
        for n in range(2 * MAX_RESUMED_PART_BYTES // len(big)):
            archive.writestr(f"f{n}", big)
    assert (tmp_path / "job" / RESUME_DIR / "page-00001.zip").stat().st_size < MAX_PART_BYTES
    assert resumed_part(out_dir, "page-00001") is None
