"""A 200-page scan OCRed by one job that fans out to child jobs (issue 23 item 2, ADR 0082) on
local OCR units, against one run of the OCR engine reading every page, in the same run.

    .venv/bin/python bench/fan_out_ocr.py [--pages 200] [--units 2]

1. **Input**: a PDF of ``--pages`` scanned pages (default 200: the issue's figure), each one of
   the corpus' three scans (``tests/data/ocr``: the 8071 page, ``eurotext.tif``,
   ``phototest.tif``) in turn, placed at 300 dpi so that a page renders at the scan's own pixels;
   nothing is downloaded.
2. **Baseline**: one run of the engine (:func:`hypermedia.engines.ocr.engine.run`, outputs
   ``text``, no escalation) in this process, before any platform starts, reading every page on
   one core: the single job the platform would run if one job read that many pages (it reads at
   most 20 without fanning out).
3. **Rows**: a private platform (embedded Postgres and NATS; credits, storage, gateway, reaper),
   and for each count of ``--units`` that many one-slot ocrworkers started for the row (default
   fan-out: more than 20 pages, groups of 10, so 19 children and the job's own last group). No
   unit has a CPU limit: the units share this machine's cores (their *CPU share*, printed).
4. **Measured**: wall seconds (the baseline's run; a row's job from ``created_at`` to
   ``completed_at``), the machine's busy CPU seconds meanwhile (``/proc/stat``), the children and
   the units that ran them, and whether the job's text is the baseline's, byte for byte.
   Printed: each row's speed-up (the baseline's wall time over its own) and its CPU over the
   baseline's (the platform's and the children's overhead).

The issue sets no figure for the speed-up: nothing here is MET or MISSED.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pypdfium2 as pdfium
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchPlatform, running_platform, temp_root, upload
from bench.fan_out import busy_seconds, run_job, speed_table
from hypermedia.engines.ocr.engine import OcrLimits, run
from tests.e2e.conftest import REPO

SCANS = ["8071_093.3B.tif", "eurotext.tif", "phototest.tif"]
PARAMS: dict[str, Any] = {"outputs": ["text"], "escalate": False}


def make_scan(path: Path, pages: int) -> None:
    """A PDF of ``pages`` image-only pages, the corpus' scans in turn, each at 300 dpi."""
    scans = []
    for name in SCANS:
        image = Image.open(REPO / "tests" / "data" / "ocr" / name).convert("L")
        scans.append((image, image.width * 72 / 300, image.height * 72 / 300))
    document = pdfium.PdfDocument.new()
    for n in range(pages):
        image, width, height = scans[n % len(scans)]
        page = document.new_page(width, height)
        picture = pdfium.PdfImage.new(document)
        bitmap = pdfium.PdfBitmap.from_pil(image)
        picture.set_bitmap(bitmap)
        picture.set_matrix(pdfium.PdfMatrix().scale(width, height))
        page.insert_obj(picture)
        page.gen_content()
        bitmap.close()
        page.close()
    document.save(str(path))
    document.close()


def _baseline(source: Path, pages: int) -> dict[str, Any]:
    """One run of the engine over every page: wall and busy CPU seconds, and its text."""
    limits = OcrLimits(max_input_bytes=1 << 30, max_page_pixels=100_000_000, max_pages=pages)
    with tempfile.TemporaryDirectory(prefix="hm-bench-ocr-") as out:
        busy, started = busy_seconds(), time.monotonic()
        run("ocr", PARAMS, source, Path(out), limits=limits)
        wall, cpu = time.monotonic() - started, busy_seconds() - busy
        return {
            "wall": wall,
            "cpu": cpu,
            "children": 0,
            "workers": 0,
            "text": (Path(out) / "text.txt").read_bytes(),
        }


def _row(bench: BenchPlatform, object_id: str, units: int) -> dict[str, Any]:
    """One job on ``units`` fresh one-slot ocrworkers (:func:`bench.fan_out.run_job`), and its text."""
    job, measured = run_job(bench, object_id, {"name": "ocr", "params": PARAMS}, units, {}, "ocrworker")
    [text] = [o for o in job["outputs"] if o["output_type"] == "text"]
    return measured | {"text": httpx.get(text["url"], timeout=60).content}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200, help="pages of the scan (21–500)")
    parser.add_argument("--units", default="2", help="OCR unit counts of the fanned-out rows")
    args = parser.parse_args()
    counts = [int(n) for n in args.units.split(",")]
    cores = os.cpu_count() or 1
    root = temp_root("hm-bench-fanout-ocr-")
    source = root / f"scan-{args.pages}.pdf"
    make_scan(source, args.pages)
    print(
        f"input: {args.pages} scanned pages, {source.stat().st_size / 1e6:.1f} MB; {cores} cores", flush=True
    )
    rows = [("one engine run, 1 core", 1, _baseline(source, args.pages))]
    print(f"baseline: {rows[0][2]['wall']:.1f} s", flush=True)
    logs = Path(tempfile.gettempdir()) / "hm-bench-fanout-ocr-logs"
    with running_platform(
        root / "platform", services="credits,storage,gateway,reaper", keep_logs=logs
    ) as bench:
        with bench.client(timeout=600) as client:
            object_id = upload(client, source)["object_id"]
        for count in counts:
            rows.append((f"fanned out, {count} unit(s)", count, _row(bench, object_id, count)))
            print(f"{rows[-1][0]}: {rows[-1][2]['wall']:.1f} s", flush=True)
    print()
    print(speed_table(rows, cores, "text", lambda row, base: row["text"] == base["text"]))
    print(
        f"\nNo goal in the issue for the speed-up (not MET or MISSED). The units share {cores} cores; "
        "a one-slot unit reads one page at a time (tesseract with one thread), as the baseline does."
    )


if __name__ == "__main__":
    main()
