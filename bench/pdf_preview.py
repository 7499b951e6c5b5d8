"""pdf_preview throughput: pages/s of the platform against a bare pypdfium2 render loop on the same
pages (issue 5's goal: at least 0.9×).

    .venv/bin/python bench/pdf_preview.py [--copies 4] [--rounds 3] [--dpi 96] [--logs DIR]

1. **Pages**: the corpus PDFs without a password (``tests/data/pdf``: 4 + 3 + 1 + 1 + 1 = 10 pages),
   ``--copies`` times: every copy is uploaded as its own object and is one job asking for all of
   its pages (how a client previews a document).
2. **Baseline**: the same pages in 1 and in 2 spawned processes (the docworker's 2 slots), each
   ``page.render(scale=dpi/72)`` (PDFium, forms drawn as the docworker draws them) and
   ``webpsave(keep="none")`` (libvips, ``VIPS_CONCURRENCY=1``); the better of the two.
3. **Platform**: embedded Postgres + NATS + ``hypermedia up`` (docworker with 2 slots); one warm-up
   job; uploads not timed; timed from the first ``POST /v1/hypermedia/process`` to the
   ``completed_at`` of the last job. Every job is checked (completed, one WebP per page).

Rounds run baseline and platform back to back, so background load hits both alike; the ratio is
the median of the rounds'. Ratios, never timed assertions (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common  # noqa: E402

GOAL = 0.9
PDF_DIR = REPO / "tests" / "data" / "pdf"
DOCUMENTS = (
    "pdflatex-4-pages.pdf",
    "multicolumn.pdf",
    "minimal-document.pdf",
    "pdflatex-forms.pdf",
    "google-doc-document.pdf",
)


def _init_worker() -> None:
    import pypdfium2  # noqa: F401  (PDFium initialised before the timed loop)
    import pyvips

    pyvips.concurrency_set(1)  # as the sandbox children (VIPS_CONCURRENCY=1)
    pyvips.cache_set_max(0)
    pyvips.Image.black(64, 64, bands=3).webpsave_buffer()


def bare_preview(path: str, page_count: int, dpi: int, out_dir: str) -> int:
    """Renders every page of ``path`` as the docworker does, without it; returns the pages done."""
    import pypdfium2 as pdfium
    import pyvips

    document = pdfium.PdfDocument(path)
    document.init_forms()
    for index in range(page_count):
        page = document[index]
        bitmap = page.render(scale=dpi / 72, may_draw_forms=True, rev_byteorder=True, prefer_bgrx=True)
        image = pyvips.Image.new_from_memory(bitmap.buffer, bitmap.width, bitmap.height, 4, "uchar")
        image.extract_band(0, n=3).webpsave(f"{out_dir}/{Path(path).stem}-{index}.webp", keep="none")
        bitmap.close()
        page.close()
    document.close()
    return page_count


def page_counts() -> dict[str, int]:
    import pypdfium2 as pdfium  # only to count pages; this process renders nothing

    return {name: len(pdfium.PdfDocument(str(PDF_DIR / name))) for name in DOCUMENTS}


def baseline(jobs: list[tuple[str, int]], dpi: int, out_dir: Path, workers: int) -> float:
    """Seconds for the bare loop over ``jobs`` on a warmed pool of ``workers`` spawned processes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
    ) as pool:
        list(pool.map(time.sleep, [0.3] * workers))  # start and warm every process
        started = time.perf_counter()
        list(pool.map(bare_preview, *zip(*[(p, n, dpi, str(out_dir)) for p, n in jobs], strict=True)))
        return time.perf_counter() - started


def platform_batch(bp: common.BenchPlatform, jobs: list[tuple[str, int]], dpi: int) -> float:
    """Seconds from the first process request to the last completed_at; checks every job."""
    with bp.client() as client:
        objects = [common.upload(client, Path(p))["object_id"] for p, _ in jobs]
        started = time.time()
        job_ids = []
        for object_id, (_, pages) in zip(objects, jobs, strict=True):
            response = client.post(
                "/v1/hypermedia/process",
                json={
                    "object_id": object_id,
                    "operations": [{"name": "pdf_preview", "params": {"pages": f"1-{pages}", "dpi": dpi}}],
                },
            )
            response.raise_for_status()
            job_ids.append(response.json()["job_ids"][0])
        common.wait_all_terminal(bp.dsn, job_ids, timeout=120 + 10 * len(jobs))
        timings = common.job_timings(bp.dsn, job_ids)
        for job_id, (_, pages) in zip(job_ids, jobs, strict=True):
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["status"] != "completed" or len(job["outputs"]) != pages:
                raise RuntimeError(f"job {job_id}: {job['status']} {job.get('error_code')}")
    return max(t["completed"] for t in timings) - started


def run(copies: int = 4, rounds: int = 3, dpi: int = 96, keep_logs: Path | None = None) -> dict[str, Any]:
    counts = page_counts()
    jobs = [(str(PDF_DIR / name), counts[name]) for _ in range(copies) for name in DOCUMENTS]
    pages = sum(n for _, n in jobs)
    root = common.temp_root("hm-bench-pdf-")
    print(
        f"pdf_preview throughput: {len(jobs)} documents, {pages} pages at {dpi} dpi -> WebP, {rounds} round(s)"
    )
    ratios = []
    try:
        with common.running_platform(root / "platform", keep_logs=keep_logs) as bp:
            warm = [(str(PDF_DIR / DOCUMENTS[0]), counts[DOCUMENTS[0]])]
            platform_batch(bp, warm, dpi)  # connections, pools, the zygote's first forks
            for r in range(rounds):
                rates = {w: pages / baseline(jobs, dpi, root / "out" / f"r{r}w{w}", w) for w in (1, 2)}
                best = max(rates.values())
                wall = platform_batch(bp, jobs, dpi)
                ratio = pages / wall / best
                ratios.append(ratio)
                print(
                    f"  r{r + 1} baseline 1 proc {rates[1]:6.1f} pages/s, 2 procs {rates[2]:6.1f} pages/s; "
                    f"platform (2 slots) {pages / wall:6.1f} pages/s ({wall:.2f}s); ratio {ratio:.2f}x"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median = statistics.median(ratios)
    print(
        f"pdf_preview: platform/baseline {median:.2f}x (goal >= {GOAL}x: {'met' if median >= GOAL else 'MISSED'})"
    )
    return {"pages": pages, "ratio": median, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dpi", type=int, default=96)
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args(argv)
    run(args.copies, args.rounds, args.dpi, args.logs)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    sys.exit(main())
