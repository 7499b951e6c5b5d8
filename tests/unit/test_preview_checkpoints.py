"""pdf_preview checkpoints in the engine (ADR 0069): the pages rendered since the last part are
kept as one part once a second of rendering passed, never the last page; a resumed job writes
the kept pages' bytes instead of rendering them and its outputs are byte for byte an
uninterrupted run's; a part of other params or a damaged one is rendered again. Real PDFium and
libvips."""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from hypermedia.engines.contract import CHECKPOINT_DIR, RESUME_DIR, keep_part
from hypermedia.engines.documents import pdf
from tests.helpers.pdf import text_pages_pdf

PAGES = 6
LIMITS = pdf.DocumentLimits(max_input_bytes=1 << 30, max_page_pixels=60_000_000)
PARAMS = {"pages": list(range(1, PAGES + 1)), "dpi": 300, "format": "webp"}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("preview-checkpoints") / "a4.pdf"
    path.write_bytes(text_pages_pdf([f"Page {n}" for n in range(1, PAGES + 1)], b"[0 0 595 842]"))
    return path


def _preview(job_dir: Path, source: Path, params: dict = PARAMS) -> dict[str, tuple[str, dict]]:
    (job_dir / "output").mkdir(parents=True)
    # In a process of its own, as the docworker's sandbox child: the engine forks its engine
    # process, and a fork of this test process, where earlier tests (the OCR checkpoints') ran
    # libvips and started its thread pool, waited for ever on a pool thread the fork had not copied.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        outputs = fresh.submit(
            pdf.run, "pdf_preview", params, source, job_dir / "output", limits=LIMITS
        ).result(120)
    return {
        o.filename: (hashlib.sha256((job_dir / "output" / o.filename).read_bytes()).hexdigest(), o.metadata)
        for o in outputs
    }


def _resume_from(first: Path, second: Path) -> None:
    shutil.copytree(first / CHECKPOINT_DIR, second / RESUME_DIR)


@pytest.fixture(scope="module")
def whole(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One uninterrupted run, with every second of rendering kept (every page but the last here:
    a 300 dpi A4 page takes about 0.35 s, so the first part holds several pages)."""
    job_dir = tmp_path_factory.mktemp("whole")
    return job_dir, _preview(job_dir, source)


def test_parts_hold_the_pages_rendered_since_the_last_and_never_the_last_page(
    whole: tuple[Path, dict],
) -> None:
    job_dir, outputs = whole
    parts = sorted(p.name for p in (job_dir / CHECKPOINT_DIR).iterdir())
    assert parts, "a 6-page preview at 300 dpi takes over a second"
    covered = []
    for name in parts:
        first, last = name.removeprefix("p").removesuffix(".zip").split("-")
        covered += range(int(first), int(last) + 1)
        with zipfile.ZipFile(job_dir / CHECKPOINT_DIR / name) as archive:
            assert sorted(archive.namelist()) == sorted(
                ["made_by.json", *(f"preview_p{n}.webp" for n in range(int(first), int(last) + 1))]
            )
    assert covered == list(range(1, covered[-1] + 1)) and covered[-1] < PAGES
    assert not any(meta["resumed"] for _, meta in outputs.values())


def test_a_resumed_preview_takes_the_kept_pages_and_gives_the_same_bytes(
    source: Path, whole: tuple[Path, dict], tmp_path: Path
) -> None:
    first, outputs = whole
    covered = {
        int(n)
        for name in (p.name for p in (first / CHECKPOINT_DIR).iterdir())
        for n in range(int(name[1:4]), int(name[5:8]) + 1)
    }
    second = tmp_path / "second"
    _resume_from(first, second)
    resumed = _preview(second, source)
    assert {name: meta["resumed"] for name, (_, meta) in resumed.items()} == {
        f"preview_p{n}.webp": n in covered for n in range(1, PAGES + 1)
    }
    assert {name: digest for name, (digest, _) in resumed.items()} == {
        name: digest for name, (digest, _) in outputs.items()
    }
    assert [meta["width"] for _, meta in resumed.values()] == [2480] * PAGES
    # Pages taken from a part are not kept again: a new part starts after them.
    again = (
        sorted(p.name for p in (second / CHECKPOINT_DIR).glob("*.zip"))
        if (second / CHECKPOINT_DIR).exists()
        else []
    )
    assert all(int(name[1:4]) > max(covered) for name in again), again


def test_a_part_of_other_params_or_a_damaged_one_is_rendered_again(
    source: Path, whole: tuple[Path, dict], tmp_path: Path
) -> None:
    first, _ = whole
    # Other params: the same pages as PNG would not be these files; at 200 dpi the same names are.
    other = tmp_path / "other"
    _resume_from(first, other)
    assert not any(meta["resumed"] for _, meta in _preview(other, source, PARAMS | {"dpi": 200}).values())
    # A part whose made_by is not this run's, or whose archive is damaged, is rendered again.
    damaged = tmp_path / "damaged"
    _resume_from(first, damaged)
    names = sorted((damaged / RESUME_DIR).iterdir())
    names[0].write_bytes(b"PK not a zip")
    for part in names[1:]:
        with zipfile.ZipFile(part) as archive:
            files = {n: archive.read(n) for n in archive.namelist()}
        part.unlink()
        keep_part(damaged / "output", part.stem, files | {"made_by.json": b"{}"})
        (damaged / CHECKPOINT_DIR / part.name).rename(part)
    assert not any(meta["resumed"] for _, meta in _preview(damaged, source).values())


def test_a_part_is_taken_for_the_plans_pages_but_the_last_only(
    source: Path, whole: tuple[Path, dict], tmp_path: Path
) -> None:
    """A part with the right maker (its child could write one) that also holds the last page and
    a file of no page: only the plan's pages but the last are taken."""
    first, outputs = whole
    made_by = None
    for part in (first / CHECKPOINT_DIR).iterdir():
        with zipfile.ZipFile(part) as archive:
            made_by = archive.read("made_by.json")
    assert made_by is not None
    spoofed = tmp_path / "spoofed"
    (spoofed / RESUME_DIR).mkdir(parents=True)
    files = {"made_by.json": made_by, f"preview_p{PAGES}.webp": b"not the last page", "../../x": b"?"}
    keep_part(spoofed / "output", "p001-006", files | {"preview_p1.webp": b"kept bytes of page 1"})
    (spoofed / CHECKPOINT_DIR / "p001-006.zip").rename(spoofed / RESUME_DIR / "p001-006.zip")
    resumed = _preview(spoofed, source)
    assert [meta["resumed"] for _, meta in resumed.values()] == [True] + [False] * (PAGES - 1)
    assert resumed[f"preview_p{PAGES}.webp"][0] == outputs[f"preview_p{PAGES}.webp"][0]
    assert not (spoofed / "x").exists() and not (tmp_path / "x").exists()
