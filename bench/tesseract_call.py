"""How the OCR engine calls tesseract: directly (:class:`hypermedia.engines.ocr.tesseract.Tesseract`,
one ``subprocess.Popen`` with the page's ``RLIMIT_CPU`` set by ``prlimit`` as it starts) against
through ``pytesseract`` (the design card's dependency list names it; issue 16, item 7), on the
same pages with the same work: one run writing ``txt``, ``tsv``, ``hocr`` and ``pdf`` with ``-l
eng --dpi 300 --psm 3`` and ``OMP_THREAD_LIMIT=1``, its TSV parsed into words.

    .venv/bin/python bench/tesseract_call.py [--rounds 5]

pytesseract's ``run_and_get_multiple_output`` cannot pass ``--dpi`` or ``--psm`` (it builds its
``config`` from the extensions alone), so the pytesseract side calls ``pytesseract.run_tesseract``,
the function its ``image_to_*`` helpers use, with those in ``config``, then reads the same files.
Each round runs every corpus page both ways, alternating which goes first; the figure is wall
seconds and the children's CPU seconds per page, and the ratio pytesseract / direct of each (the
median over rounds). **Goal: the direct call costs no more than pytesseract (ratio ≥ 1.0 means
pytesseract is as cheap or cheaper)**: the issue's rule is to call tesseract through pytesseract
unless a measurement shows it costs more. Ratios, never timed assertions.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pytesseract import pytesseract  # noqa: E402  (the module: run_tesseract is not re-exported)

from hypermedia.engines.ocr import tesseract  # noqa: E402

PAGES = ("phototest.tif", "eurotext.tif", "8071_093.3B.tif")
RENDERERS = ("txt", "tsv", "hocr", "pdf")
DPI = 300
TIMEOUT = 120.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def direct(page: Path, work: Path) -> int:
    """The engine's own call; returns the words found."""
    text = tesseract.Tesseract(timeout_seconds=TIMEOUT).recognise(
        page, languages=["eng"], dpi=DPI, hocr=True, pdf=True
    )
    return len(text.words)


def through_pytesseract(page: Path, work: Path) -> int:
    """The same run through pytesseract, the same files read and parsed; returns the words found."""
    base = work / f"{page.name}-pyt"
    pytesseract.run_tesseract(
        str(page),
        str(base),
        extension="txt hocr pdf",  # pytesseract drops "tsv" from extension; it goes in config
        lang="eng",
        config=f"--dpi {DPI} --psm 3 tsv",
        timeout=int(TIMEOUT),
    )
    Path(f"{base}.txt").read_text(encoding="utf-8", errors="replace")
    words = tesseract.parse_tsv(Path(f"{base}.tsv").read_text(encoding="utf-8", errors="replace"))
    return len(words)


def measure(fn: Callable[[Path, Path], int], page: Path, work: Path) -> tuple[float, float, int]:
    """(wall seconds, children's CPU seconds, words) of one call."""
    cpu, started = _children_cpu(), time.perf_counter()
    words = fn(page, work)
    return time.perf_counter() - started, _children_cpu() - cpu, words


def run(rounds: int) -> dict[str, float] | None:
    """The comparison; ``None`` (and a message) without tesseract."""
    if shutil.which("tesseract") is None:
        print("tesseract_call: skipped (no tesseract)")
        return None
    os.environ["OMP_THREAD_LIMIT"] = "1"  # pytesseract's child inherits it; the direct call sets it
    corpus = REPO / "tests" / "data" / "ocr"
    walls: dict[str, list[float]] = {"direct": [], "pytesseract": []}
    cpus: dict[str, list[float]] = {"direct": [], "pytesseract": []}
    with tempfile.TemporaryDirectory(prefix="hm-tesseract-call-") as tmp:
        work = Path(tmp)
        pages = []
        for name in PAGES:
            shutil.copy(corpus / name, work / name)
            pages.append(work / name)
        for page in pages:  # warm-up: models into the page cache
            measure(direct, page, work)
        for round_number in range(rounds):
            order = [("direct", direct), ("pytesseract", through_pytesseract)]
            if round_number % 2:
                order.reverse()
            totals = {"direct": [0.0, 0.0], "pytesseract": [0.0, 0.0]}
            found: dict[str, list[int]] = {"direct": [], "pytesseract": []}
            for page in pages:
                for label, fn in order:
                    wall, cpu, words = measure(fn, page, work)
                    totals[label][0] += wall
                    totals[label][1] += cpu
                    found[label].append(words)
            if found["direct"] != found["pytesseract"]:
                raise SystemExit(f"the two calls read different words: {found}")
            for label, (wall, cpu) in totals.items():
                walls[label].append(wall / len(pages))
                cpus[label].append(cpu / len(pages))
    result = {
        "direct_wall": statistics.median(walls["direct"]),
        "pytesseract_wall": statistics.median(walls["pytesseract"]),
        "direct_cpu": statistics.median(cpus["direct"]),
        "pytesseract_cpu": statistics.median(cpus["pytesseract"]),
    }
    result["wall_ratio"] = result["pytesseract_wall"] / result["direct_wall"]
    result["cpu_ratio"] = result["pytesseract_cpu"] / result["direct_cpu"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    result = run(args.rounds)
    if result is None:
        return 0
    print(
        f"tesseract_call: per page, direct {result['direct_wall']:.3f} s wall / {result['direct_cpu']:.3f} s CPU, "
        f"pytesseract {result['pytesseract_wall']:.3f} s / {result['pytesseract_cpu']:.3f} s; "
        f"pytesseract / direct: wall {result['wall_ratio']:.3f}x, CPU {result['cpu_ratio']:.3f}x "
        f"(the direct call costs no more than pytesseract, ratio >= 1.0: "
        f"{'MET' if result['wall_ratio'] >= 1.0 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
