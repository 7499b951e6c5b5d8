"""A long OCR in child jobs, in the engine (ADR 0082): the first run asks to fan out without
rendering a page, each child reads its group and keeps every page of it as the job's part, the
job's last run takes those parts, reads only its own last group and writes the outputs one run
makes. Real tesseract, real PDFium; the worker's side is tests/integration/test_child_jobs.py and
tests/e2e/test_checkpoints.py."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import CHECKPOINT_DIR, FAN_OUT, RESUME_DIR, OutputFile
from hypermedia.engines.ocr.engine import run
from hypermedia.engines.ocr.fanning import page_groups
from hypermedia.engines.ocr.params import MAX_FANNED_OCR_PAGES
from tests.helpers.ocr import LIMITS
from tests.helpers.pdf import text_pages_pdf

WORDS = ["harbour", "lantern", "meadow", "orchard", "pebble", "quartz", "saddle"]
TEXTS = [f"Page {i + 1} {word}" for i, word in enumerate(WORDS)]
FANNED = dataclasses.replace(LIMITS, fan_out_pages=5, fan_out_group_pages=2)
"""Seven pages in groups of two: children read 1–2, 3–4 and 5–6, the job 7."""
PARAMS = {"outputs": ["text", "words", "searchable_pdf"], "escalate": False}


def _job_dir(root: Path) -> Path:
    (root / "output").mkdir(parents=True)
    return root


def _run(job_dir: Path, source: Path, **limits: Any) -> list[OutputFile]:
    return run("ocr", PARAMS, source, job_dir / "output", limits=dataclasses.replace(FANNED, **limits))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ocr-fan-out") / "seven.pdf"
    path.write_bytes(text_pages_pdf(TEXTS))
    return path


@pytest.fixture(scope="module")
def alone(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, OutputFile]]:
    """The job read in one run (no fan-out): its output directory and outputs."""
    job = _job_dir(tmp_path_factory.mktemp("alone"))
    outputs = run("ocr", PARAMS, source, job / "output", limits=LIMITS)
    return job / "output", {o.output_type: o for o in outputs}


def _pdf_words(path: Path) -> list[list[str]]:
    pdf = pdfium.PdfDocument(path)
    try:
        return [pdf[i].get_textpage().get_text_bounded().split() for i in range(len(pdf))]
    finally:
        pdf.close()


def test_a_long_ocr_is_read_by_children_and_joined_as_one_run(
    source: Path, alone: tuple[Path, dict[str, OutputFile]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone_dir, alone_outputs = alone
    alone_text = (alone_dir / "text.txt").read_text()

    renders: list[int] = []
    from hypermedia.engines.ocr import engine

    real = engine._ocr_page

    def counting(page, *args, **kwargs):  # type: ignore[no-untyped-def]
        renders.append(page.number)
        return real(page, *args, **kwargs)

    monkeypatch.setattr(engine, "_ocr_page", counting)

    first = _job_dir(tmp_path / "first")
    [request] = _run(first, source, fan_out=True)
    assert request.output_type == FAN_OUT and request.metadata == {"chunks": 4}
    plan = json.loads((first / "output" / request.filename).read_text())
    assert plan == {"chunks": [[1, 2], [3, 4], [5, 6], [7]]}
    assert renders == [] and not (first / CHECKPOINT_DIR).exists(), "asking reads nothing"

    parent = _job_dir(tmp_path / "parent")
    (parent / RESUME_DIR).mkdir()
    for group in range(4):
        child = _job_dir(tmp_path / f"child-{group}")
        assert _run(child, source, group=group) == [], "a child's pages are its parent's parts"
        kept = sorted(p.name for p in (child / CHECKPOINT_DIR).glob("*.zip")) if group < 3 else []
        assert kept == [f"page-{n:05d}.zip" for n in plan["chunks"][group]] if group < 3 else not kept
        for part in kept:  # what the worker stores under the parent, and restores for its next run
            shutil.copy(child / CHECKPOINT_DIR / part, parent / RESUME_DIR / part)
    assert renders == [1, 2, 3, 4, 5, 6], "each child read its group; the last group is the job's"
    assert not (tmp_path / "child-3" / CHECKPOINT_DIR).exists()

    renders.clear()
    joined = {o.output_type: o for o in _run(parent, source)}
    assert renders == [7], "the job read only its own group"
    assert (parent / "output" / "text.txt").read_text() == alone_text
    for word in WORDS:
        assert word in alone_text
    meta = joined["text"].metadata
    assert meta["pages"] == list(range(1, 8)) and meta["resumed_pages"] == list(range(1, 7))
    assert meta["page_count"] == 7 and meta["word_count"] == alone_outputs["text"].metadata["word_count"]
    assert _pages_of(parent / "output" / "words.json") == _pages_of(alone_dir / "words.json")
    words = _pdf_words(parent / "output" / "searchable.pdf")
    assert len(words) == 7 and words == _pdf_words(alone_dir / "searchable.pdf")
    assert not (parent / CHECKPOINT_DIR).exists(), "nothing read but the last page: nothing kept"


def test_a_group_no_child_kept_is_read_by_the_job(
    source: Path, alone: tuple[Path, dict[str, OutputFile]], tmp_path: Path
) -> None:
    """A child that failed (one attempt) kept nothing: the job's last run reads its pages too."""
    parent = _job_dir(tmp_path / "parent")
    (parent / RESUME_DIR).mkdir()
    child = _job_dir(tmp_path / "child")
    _run(child, source, group=1)
    for part in (child / CHECKPOINT_DIR).glob("*.zip"):
        shutil.copy(part, parent / RESUME_DIR / part.name)
    outputs = {o.output_type: o for o in _run(parent, source)}
    assert outputs["text"].metadata["resumed_pages"] == [3, 4]
    assert (parent / "output" / "text.txt").read_text() == (alone[0] / "text.txt").read_text()
    # What the job read itself but the last page is kept, as any attempt keeps it (ADR 0069).
    assert sorted(p.stem for p in (parent / CHECKPOINT_DIR).glob("*.zip")) == [
        "page-00001",
        "page-00002",
        "page-00005",
        "page-00006",
    ]


def test_a_child_outside_the_plan_reads_nothing(source: Path, tmp_path: Path) -> None:
    for group in (3, 4, 99):
        child = _job_dir(tmp_path / f"child-{group}")
        assert _run(child, source, group=group) == []
        assert not (child / CHECKPOINT_DIR).exists()
    short = _job_dir(tmp_path / "short")  # a plan that makes no children: seven pages, none fans out
    assert _run(short, source, group=0, fan_out_pages=7) == []
    assert not (short / CHECKPOINT_DIR).exists()


def test_too_few_pages_are_read_by_the_job_itself(source: Path, tmp_path: Path) -> None:
    job = _job_dir(tmp_path / "job")
    outputs = {o.output_type: o for o in _run(job, source, fan_out=True, fan_out_pages=7)}
    assert FAN_OUT not in outputs
    assert outputs["text"].metadata["pages"] == list(range(1, 8))


def test_groups_shrink_so_that_the_job_never_reads_more_than_one(tmp_path: Path) -> None:
    """Groups of 11 of 22 pages would be two, and the job would read 22 pages itself: they
    shrink to three groups instead (found by a hostile review)."""
    limits = dataclasses.replace(FANNED, fan_out_pages=20, fan_out_group_pages=11)
    assert [len(g) for g in page_groups(list(range(1, 23)), limits)] == [8, 8, 6]
    assert [
        len(g) for g in page_groups(list(range(1, 26)), dataclasses.replace(limits, fan_out_group_pages=10))
    ] == [
        9,
        9,
        7,
    ]
    assert [len(g) for g in page_groups(list(range(1, 8)), FANNED)] == [2, 2, 2, 1]


def test_the_page_cap_of_a_job_that_fans_out(tmp_path: Path) -> None:
    """Up to MAX_FANNED_OCR_PAGES pages fan out (planned from the page sizes: nothing is rendered),
    one more is OCR_PAGE_LIMIT; without fan-out the cap stays 20 pages."""
    document = pdfium.PdfDocument.new()
    for _ in range(MAX_FANNED_OCR_PAGES + 1):
        document.new_page(595, 842).close()
    over = tmp_path / "over.pdf"
    document.save(str(over))
    document.del_page(0)
    at_cap = tmp_path / "at-cap.pdf"
    document.save(str(at_cap))
    document.close()
    job = _job_dir(tmp_path / "job")
    with pytest.raises(PermanentJobError) as caught:
        _run(job, over, fan_out=True)
    assert caught.value.error_code == "OCR_PAGE_LIMIT"
    assert f"{MAX_FANNED_OCR_PAGES + 1} pages; one job OCRs at most {MAX_FANNED_OCR_PAGES}" in (
        caught.value.public_message
    )
    [request] = _run(job, at_cap, fan_out=True)
    groups = page_groups(list(range(1, MAX_FANNED_OCR_PAGES + 1)), FANNED)
    assert request.metadata == {"chunks": len(groups)} and len(groups) == 56
    assert [len(g) for g in groups] == [9] * 55 + [5], "groups grow so that there are at most 60"
    assert not list(job.glob("**/*.gray")), "no page rendered"
    with pytest.raises(PermanentJobError) as alone:
        run("ocr", PARAMS, at_cap, job / "output", limits=LIMITS)
    assert alone.value.error_code == "OCR_PAGE_LIMIT" and "at most 20" in alone.value.public_message


def _pages_of(words_json: Path) -> object:
    """The page records of a words document (its summary differs: ``resumed_pages``)."""
    return json.loads(words_json.read_text())["pages"]


def test_the_ocrworker_gives_each_run_its_part_in_the_fan_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job may ask; a child reads its group; a job that fanned out does neither; the settings
    come from the environment (0: never), and a value that would leave a gap is refused."""
    from hypermedia.core import config
    from services.ocrworker.__main__ import OcrHandler
    from services.ocrworker.settings import OcrSettings
    from tests.helpers.jobs import claimed_job

    job = claimed_job("ocr", "ocr", max_pixels=64_000_000)
    limits = OcrHandler().entry_kwargs(job)["limits"]
    assert (limits.fan_out_pages, limits.fan_out_group_pages, limits.fan_out, limits.group) == (
        20,
        10,
        True,
        None,
    )
    child = dataclasses.replace(job, parent_job_id="00000000-0000-0000-0000-000000000009", chunk_index=4)
    of_child = OcrHandler().entry_kwargs(child)["limits"]
    assert (of_child.fan_out, of_child.group) == (False, 4)
    fanned = dataclasses.replace(job, fanned_out=True)
    assert OcrHandler().entry_kwargs(fanned)["limits"].fan_out is False
    monkeypatch.setenv("HM_OCR_FAN_OUT_PAGES", "0")
    monkeypatch.setenv("HM_OCR_FAN_OUT_GROUP_PAGES", "5")
    never = OcrHandler(config.load(OcrSettings)).entry_kwargs(job)["limits"]
    assert (never.fan_out_pages, never.fan_out_group_pages, never.page_cap(21)) == (None, 5, 20)
    monkeypatch.setenv("HM_OCR_FAN_OUT_PAGES", "21")
    with pytest.raises(config.ConfigError, match="HM_OCR_FAN_OUT_PAGES"):
        config.load(OcrSettings)


def test_a_multi_page_tiff_fans_out_as_a_pdf_does(source: Path, tmp_path: Path) -> None:
    """The pages of an image are loaded only when read: a child of a seven-page TIFF reads its
    group, and the job's last run takes the kept pages and reads the rest."""
    pdf = pdfium.PdfDocument(source)
    try:
        frames = [pdf[i].render(scale=300 / 72, grayscale=True).to_pil() for i in range(len(pdf))]
    finally:
        pdf.close()
    tiff = tmp_path / "seven.tif"
    frames[0].save(tiff, save_all=True, append_images=frames[1:], compression="tiff_lzw", dpi=(300, 300))
    first = _job_dir(tmp_path / "first")
    [request] = _run(first, tiff, fan_out=True)
    assert request.metadata == {"chunks": 4}
    child = _job_dir(tmp_path / "child")
    assert _run(child, tiff, group=2) == []
    assert sorted(p.stem for p in (child / CHECKPOINT_DIR).glob("*.zip")) == ["page-00005", "page-00006"]
    parent = _job_dir(tmp_path / "parent")
    (parent / RESUME_DIR).mkdir()
    for part in (child / CHECKPOINT_DIR).glob("*.zip"):
        shutil.copy(part, parent / RESUME_DIR / part.name)
    outputs = {o.output_type: o for o in _run(parent, tiff)}
    assert outputs["text"].metadata["resumed_pages"] == [5, 6]
    assert outputs["text"].metadata["source_format"] == "tiff"
    pages = (parent / "output" / "text.txt").read_text().split("\f")
    assert [page.split()[:2] for page in pages] == [["Page", str(n)] for n in range(1, 8)], pages


def _forged(files: dict[str, bytes], change: str, three_pages: bytes) -> dict[str, bytes]:
    """A child's part for page 3 changed as a child an exploit took over could change it: its
    fingerprint (``made_by.json``) kept, since a child knows the params and tesseract's version."""
    record = json.loads(files["record.json"])
    if change == "a record without its word count":
        del record["word_count"]
    elif change == "a word count that is text":
        record["word_count"] = "x"
    elif change == "a PDF page that is no PDF":
        return files | {"page.pdf": b"%PDF-1.4 garbage"}
    elif change == "three PDF pages for one":
        return files | {"page.pdf": three_pages}
    elif change == "an hOCR page without a body":
        return files | {"page.hocr": b"<html>nothing</html>"}
    elif change == "no PDF page":
        return {name: data for name, data in files.items() if name != "page.pdf"}
    return files | {"record.json": json.dumps(record).encode()}


def test_a_forged_part_is_read_again_never_assembled(source: Path, tmp_path: Path) -> None:
    """Parts come from children that ran the same hostile file: one whose shape would crash the
    assembly or change the number of pages of an output is refused, and its page read again."""
    import zipfile

    from hypermedia.engines.contract import keep_part

    params = {"outputs": ["text", "words", "hocr", "searchable_pdf"], "escalate": False}
    child = _job_dir(tmp_path / "child")
    for group in range(3):  # every child, so that each job below reads only pages 3 and 7
        run("ocr", params, source, child / "output", limits=dataclasses.replace(FANNED, group=group))
    with zipfile.ZipFile(child / CHECKPOINT_DIR / "page-00003.zip") as part:
        files = {name: part.read(name) for name in part.namelist()}
    three = tmp_path / "three.pdf"
    three.write_bytes(text_pages_pdf(TEXTS[:3]))
    for change in (
        "a record without its word count",
        "a word count that is text",
        "a PDF page that is no PDF",
        "three PDF pages for one",
        "an hOCR page without a body",
        "no PDF page",
    ):
        parent = _job_dir(tmp_path / change.replace(" ", "-"))
        keep_part(parent / "output", "page-00003", _forged(files, change, three.read_bytes()))
        (parent / RESUME_DIR).mkdir()
        (parent / CHECKPOINT_DIR / "page-00003.zip").rename(parent / RESUME_DIR / "page-00003.zip")
        for kept in (1, 2, 4, 5, 6):
            name = f"page-{kept:05d}.zip"
            shutil.copy(child / CHECKPOINT_DIR / name, parent / RESUME_DIR / name)
        outputs = {o.output_type: o for o in run("ocr", params, source, parent / "output", limits=FANNED)}
        assert outputs["text"].metadata["resumed_pages"] == [1, 2, 4, 5, 6], change
        assert len(_pdf_words(parent / "output" / "searchable.pdf")) == 7, change
        hocr = (parent / "output" / "text.hocr").read_text()
        assert len(re.findall(r"class=['\"]ocr_page['\"]", hocr)) == 7, change


def test_a_huge_page_with_a_text_layer_fans_out_as_one_run_takes_it(tmp_path: Path) -> None:
    """With ``skip_text_pages``, a page too large to render that has a text layer is taken by its
    layer in one run; the first run, a child and the job's last run take it too (found by a
    hostile review: they checked its pixels, as they did not read its layer)."""
    layers = [f"{text} beside the {word} road" for text, word in zip(TEXTS, reversed(WORDS), strict=True)]
    document = pdfium.PdfDocument(text_pages_pdf(layers))  # 16 characters or more: a text layer each
    huge = pdfium.PdfDocument(text_pages_pdf([layers[3]], media=b"[0 0 14400 14400]"))
    document.del_page(3)
    document.import_pages(huge, [0], index=3)
    path = tmp_path / "huge.pdf"
    document.save(str(path))
    document.close()
    huge.close()
    params = {"outputs": ["text"], "escalate": False, "skip_text_pages": True}
    alone = run("ocr", params, path, _job_dir(tmp_path / "alone") / "output", limits=LIMITS)
    assert alone[0].metadata["skipped_pages"] == list(range(1, 8))
    [request] = run(
        "ocr",
        params,
        path,
        _job_dir(tmp_path / "first") / "output",
        limits=dataclasses.replace(FANNED, fan_out=True),
    )
    assert request.output_type == FAN_OUT
    assert (
        run(
            "ocr",
            params,
            path,
            _job_dir(tmp_path / "child") / "output",
            limits=dataclasses.replace(FANNED, group=0),
        )
        == []
    )
    last = run("ocr", params, path, _job_dir(tmp_path / "last") / "output", limits=FANNED)
    assert last[0].metadata["skipped_pages"] == list(range(1, 8))
    assert (tmp_path / "last" / "output" / "text.txt").read_text() == (
        tmp_path / "alone" / "output" / "text.txt"
    ).read_text()
