"""Escalation of poorly read pages to RapidOCR (hypermedia.engines.ocr.escalation, hypermedia.engines.ocr.rapid_ocr),
with the real tesseract and the real RapidOCR (its models from its PyPI wheel), on ``phototest.tif``
from ``tests/data/ocr/`` and on a degraded copy made here with libvips; and once in a real sandbox
child under its ``RLIMIT_NPROC``, as the ocrworker will run it.

The CERs of the degraded page with and without escalation are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pyvips

from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.ocr import escalation, params, preprocess
from hypermedia.engines.ocr.engine import ESCALATION_CPU_RESERVE, OcrLimits, run
from hypermedia.engines.ocr.metrics import cer
from hypermedia.engines.ocr.rapid_ocr import _RawWord, page_text, reading_order
from hypermedia.engines.ocr.recognition import PageText, Word
from hypermedia.sandbox import Sandbox, SandboxLimits

OCR_DIR = Path(__file__).resolve().parents[1] / "data" / "ocr"
PHOTOTEST = OCR_DIR / "phototest.tif"
GOLD = (OCR_DIR / "phototest.gold.txt").read_text(encoding="utf-8")
LIMITS = OcrLimits(max_input_bytes=100 << 20, max_page_pixels=100_000_000)

pytestmark = pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed")


def run_ocr(source: Path, tmp_path: Path, **job_params: Any) -> tuple[str, dict, dict]:
    """``(text, words document, metadata of the text output)``."""
    out_dir = tmp_path / f"out-{secrets.token_hex(4)}"
    out_dir.mkdir()
    outputs = run("ocr", {"outputs": ["text", "words"], **job_params}, source, out_dir, limits=LIMITS)
    by_type = {o.output_type: o for o in outputs}
    text = (out_dir / "text.txt").read_text(encoding="utf-8")
    words = json.loads((out_dir / "words.json").read_text(encoding="utf-8"))
    return text, words, by_type["text"].metadata


@pytest.fixture(scope="module")
def blurred_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``phototest.tif`` blurred with a Gaussian of σ = 2.5 px: tesseract finds one "word" in it
    (99 % CER, mean confidence 27.5), RapidOCR reads it at about 3 % CER."""
    page = preprocess.to_grey(pyvips.Image.new_from_file(str(PHOTOTEST))).gaussblur(2.5)
    path = tmp_path_factory.mktemp("escalation") / "blurred.png"
    page.pngsave(str(path))
    return path


# --- pure Python -----------------------------------------------------------------------------------


def test_escalate_param() -> None:
    assert params.validate_params("ocr", {})["escalate"] is True
    assert params.validate_params("ocr", {"escalate": False})["escalate"] is False
    with pytest.raises(InvalidArgument) as caught:
        params.validate_params("ocr", {"escalate": "no"})
    assert caught.value.error_code == "INVALID_PARAMS"


def _page(engine: str, confs: list[float]) -> PageText:
    words = tuple(Word(f"w{i}", (10 * i, 0, 8, 10), conf, 1, 1, 1, i + 1) for i, conf in enumerate(confs))
    return PageText(engine=engine, text=" ".join(w.text for w in words), words=words)


def test_choose_offsets_rapidocr_and_needs_its_words() -> None:
    poor = _page("tesseract", [60.0] * 10)
    assert escalation.needs_escalation(poor)
    assert not escalation.needs_escalation(_page("tesseract", [96.0] * 10))
    assert not escalation.needs_escalation(_page("tesseract", []))
    assert escalation.choose(poor, _page("rapidocr", [98.0] * 10)).reason == "higher_confidence"
    assert escalation.choose(poor, _page("rapidocr", [98.0] * 10)).kept.engine == "rapidocr"
    # Within RAPIDOCR_OFFSET of tesseract: tesseract is kept.
    fair = _page("tesseract", [89.0] * 10)
    assert escalation.choose(fair, _page("rapidocr", [93.0] * 10)).kept is fair
    # Sure of the few words it found, but it lost most of the page.
    assert escalation.choose(poor, _page("rapidocr", [99.0] * 3)).reason == "too_few_words"
    assert escalation.choose(poor, _page("rapidocr", [])).kept is poor


def test_reading_order_follows_the_blocks_of_the_other_engine() -> None:
    """Two columns whose lines RapidOCR detected as one line each across the gap: tesseract's
    column blocks cut them, and the left column is read before the right one."""
    words = [
        _RawWord("left1", (0, 0, 40, 10), 99.0, 0),
        _RawWord("right1", (100, 0, 40, 10), 99.0, 0),
        _RawWord("left2", (0, 15, 40, 10), 99.0, 1),
        _RawWord("right2", (100, 15, 40, 10), 99.0, 1),
    ]
    ordered = reading_order(words, [(0, 0, 50, 30), (90, 0, 60, 30)])
    assert [w.text for w in ordered] == ["left1", "left2", "right1", "right2"]
    assert [(w.block, w.line, w.word) for w in ordered] == [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1)]
    assert page_text(ordered) == "left1\nleft2\n\nright1\nright2"
    assert page_text(reading_order(words, [])) == "left1 right1\nleft2 right2"


# --- real engines ----------------------------------------------------------------------------------


def test_degraded_page_is_escalated_and_its_error_rate_drops(tmp_path: Path, blurred_page: Path) -> None:
    bare_text, bare_words, _ = run_ocr(blurred_page, tmp_path, escalate=False)
    text, words, metadata = run_ocr(blurred_page, tmp_path)
    bare_cer, escalated_cer = cer(bare_text, GOLD), cer(text, GOLD)
    print(
        f"\nblurred phototest (σ = 2.5 px): CER tesseract {bare_cer:.2%}, with escalation {escalated_cer:.2%}"
    )
    page = words["pages"][0]
    assert page["escalated"] is True
    assert page["engine"] == "rapidocr"
    assert page["escalation"]["reason"] == "higher_confidence"
    assert page["escalation"]["cpu_seconds"] > 0
    assert page["confidences"]["tesseract"] < escalation.ESCALATION_THRESHOLD
    assert page["confidences"]["rapidocr"] > page["confidences"]["tesseract"]
    assert page["mean_confidence"] == page["confidences"]["rapidocr"]
    assert page["hocr_pdf_engine"] == "tesseract"
    assert words["escalation_engine"]["name"] == "rapidocr"
    assert escalated_cer < 0.08
    assert escalated_cer < bare_cer / 5
    # The words are RapidOCR's, in the words JSON's shape, boxes in the page's pixels.
    assert page["word_count"] == len(page["words"]) > 40
    for word in page["words"]:
        x, y, w, h = word["bbox"]
        assert 0 <= x and 0 <= y and x + w <= page["width"] + 2 and y + h <= page["height"] + 2
        assert 0 <= word["conf"] <= 100
        assert word["text"] and not any(c.isspace() for c in word["text"])
        assert min(word["block"], word["par"], word["line"], word["word"]) >= 1
    assert metadata["escalated_pages"] == 1
    assert metadata["escalation_cpu_seconds"] > 0
    assert bare_words["pages"][0]["escalation"]["reason"] == "disabled"


def test_escalated_page_keeps_tesseracts_hocr_and_pdf(tmp_path: Path, blurred_page: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    outputs = run(
        "ocr", {"outputs": ["text", "hocr", "searchable_pdf"]}, blurred_page, out_dir, limits=LIMITS
    )
    assert [o.output_type for o in outputs] == ["text", "hocr", "searchable_pdf"]
    assert all(o.metadata["escalated_pages"] == 1 for o in outputs)
    assert "ocr_page" in (out_dir / "text.hocr").read_text(encoding="utf-8")
    assert (out_dir / "searchable.pdf").read_bytes().startswith(b"%PDF-")


def test_clean_page_is_not_escalated(tmp_path: Path) -> None:
    text, words, metadata = run_ocr(PHOTOTEST, tmp_path)
    page = words["pages"][0]
    assert page["escalated"] is False
    assert page["engine"] == "tesseract"
    assert page["escalation"] == {"reason": "not_needed", "cpu_seconds": 0.0}
    assert list(page["confidences"]) == ["tesseract"]
    assert page["confidences"]["tesseract"] >= escalation.ESCALATION_THRESHOLD
    assert "escalation_engine" not in words
    assert metadata["escalated_pages"] == 0
    assert metadata["escalation_cpu_seconds"] == 0.0
    assert cer(text, GOLD) < 0.02


def test_escalate_false_disables_it(tmp_path: Path, blurred_page: Path) -> None:
    text, words, metadata = run_ocr(blurred_page, tmp_path, escalate=False)
    page = words["pages"][0]
    assert page["escalated"] is False
    assert page["engine"] == "tesseract"
    assert page["escalation"]["reason"] == "disabled"
    assert page["confidences"]["tesseract"] < escalation.ESCALATION_THRESHOLD
    assert metadata["escalated_pages"] == 0
    assert cer(text, GOLD) > 0.5


# --- in a real sandbox child -----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    """A zygote as the ocrworker will have one (own uid range, apart from the other tests')."""
    work_dir = tmp_root / f"ocr-escalation-{secrets.token_hex(4)}"
    work_dir.mkdir(mode=0o755)
    uids = range(63110, 63112) if os.geteuid() == 0 else None
    box = Sandbox(work_dir, preload=("pyvips", "pypdfium2", "hypermedia.engines.ocr.engine"), uid=uids)
    await box.start()
    yield box
    await box.close()


async def test_escalation_in_a_sandbox_child(sandbox: Sandbox, blurred_page: Path) -> None:
    """RapidOCR in a forked child with the sandbox's default ``RLIMIT_NPROC`` (16 tasks of its
    uid, threads included), its address-space limit and no network: one onnxruntime thread, the
    models from the installed wheel."""
    # CPU above ESCALATION_CPU_RESERVE, or the page is not escalated (the test below).
    limits = SandboxLimits(cpu_seconds=120, wall_seconds=180, memory_bytes=2 << 30, fsize_bytes=1 << 30)
    assert limits.nproc == 16
    page, _metadata, text = await _escalation_in_sandbox(sandbox, blurred_page, limits)
    assert page["escalated"] is True
    assert page["engine"] == "rapidocr"
    assert cer(text, GOLD) < 0.08


async def _escalation_in_sandbox(
    sandbox: Sandbox, page: Path, limits: SandboxLimits
) -> tuple[dict, dict, str]:
    """OCRs ``page`` in a child of ``sandbox`` under ``limits``: its words-document page record,
    its text output's metadata and its text."""
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = sandbox.prepare(job_id)
    input_path = job_dir / "input" / "source"
    shutil.copy(page, input_path)
    os.chmod(input_path, 0o600)
    try:
        result = await sandbox.run(
            job_id,
            "hypermedia.engines.ocr.engine:run",
            "ocr",
            {"outputs": ["text", "words"]},
            input_path,
            limits,
            entry_kwargs={"limits": LIMITS},
        )
        assert result.error_code is None, result
        files = {o.output_type: (job_dir / "output" / o.filename).read_bytes() for o in result.outputs}
        metadata = next(o.metadata for o in result.outputs if o.output_type == "text")
    finally:
        sandbox.cleanup(job_id)
    return json.loads(files["words"])["pages"][0], metadata, files["text"].decode()


async def test_an_escalation_out_of_memory_keeps_tesseracts_reading(
    sandbox: Sandbox, blurred_page: Path
) -> None:
    """800 MiB of address space: enough for tesseract, not for RapidOCR's models (measured: it
    fails under 900 MiB and reads the page under 1200). The job completes with tesseract's
    reading, the page is not counted (nor charged) as escalated, and the failure is recorded."""
    limits = SandboxLimits(cpu_seconds=120, wall_seconds=180, memory_bytes=800 << 20, fsize_bytes=1 << 30)
    page, metadata, text = await _escalation_in_sandbox(sandbox, blurred_page, limits)
    assert page["escalation"]["reason"] == "failed_resource_limit"
    assert page["engine"] == "tesseract" and page["escalated"] is False
    assert metadata["escalated_pages"] == 0
    assert cer(text, GOLD) > 0.5  # tesseract's poor reading of the blurred page, kept


async def test_no_escalation_when_the_jobs_cpu_budget_is_nearly_spent(
    sandbox: Sandbox, blurred_page: Path
) -> None:
    """A job whose RLIMIT_CPU leaves less than ESCALATION_CPU_RESERVE seconds keeps tesseract's
    reading instead of running into its CPU limit (a TIMEOUT after all its work)."""
    seconds = int(ESCALATION_CPU_RESERVE) - 10
    limits = SandboxLimits(
        cpu_seconds=seconds, wall_seconds=seconds * 1.5, memory_bytes=2 << 30, fsize_bytes=1 << 30
    )
    page, metadata, _text = await _escalation_in_sandbox(sandbox, blurred_page, limits)
    assert page["escalation"] == {"reason": "cpu_budget", "cpu_seconds": 0.0}
    assert page["engine"] == "tesseract" and metadata["escalated_pages"] == 0


def test_rapidocr_out_of_time_is_the_page_timeout_not_its_own_error(blurred_page: Path) -> None:
    """0.2 s for a page RapidOCR needs about 2 s for (warm): the timer fires inside onnxruntime's
    call, which RapidOCR re-raises as its own ONNXRuntimeError; what comes out is the
    ``OCR_PAGE_TIMEOUT`` the engine turns into tesseract's reading kept (``failed_ocr_page_timeout``,
    the same path as the out-of-memory test above), not an INTERNAL failure of the job."""
    from hypermedia.core.errors import PermanentJobError
    from hypermedia.engines.ocr.rapid_ocr import RapidOcrEngine

    RapidOcrEngine(timeout_seconds=60).recognise(blurred_page, languages=["eng"], dpi=300)  # warm
    with pytest.raises(PermanentJobError) as caught:
        RapidOcrEngine(timeout_seconds=0.2).recognise(blurred_page, languages=["eng"], dpi=300)
    assert caught.value.error_code == "OCR_PAGE_TIMEOUT"
