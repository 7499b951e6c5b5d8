"""How accurate ``POST /v1/hypermedia/estimate`` is on the corpus (issue 22 item 3): its credits
against what the jobs were then held and charged, and its predicted run time against the run
each job then had, leave-one-out (each file predicted from the history of all the others, with the
estimate's own :func:`services.gateway.estimates.fit`), against a baseline measured in the same
run: the median run time of the others, which ignores the input's size.

    .venv/bin/python bench/estimate_accuracy.py [--operation thumbnail] [--photos 1,2,4,8,12,24] [--logs DIR]

A private platform (credits, storage, gateway, imageworker, docworker); every image of
``../shared/corpus`` and ``tests/data`` (``thumbnail``), or every PDF (``pdf_preview``), is run once,
one at a time. The corpus' images are at most 12 MP and mostly under 1 MP, far from what cameras
upload, so ``thumbnail`` also runs camera-size photos made from the corpus photo (``--photos``:
megapixels, 4:3, JPEG Q90 with noise, as bench/thumbnail_throughput.py makes them; ``""``: none).

Printed: the credits' exactness (estimate = hold = charge, in millicredits); then for a fresh
upload (no job read it: its size only) and for an object an earlier job read (its measures
known), the median absolute error of the predicted run time (% of the actual run), the share
predicted within 2× of it, for the estimate and for the baseline, their ratio, and which basis
the predictions used. There is no numeric goal in the issue: the figures go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, vipswork  # noqa: E402
from hypermedia.jobs import facts  # noqa: E402
from services.gateway.estimates import MIB, Run, choose  # noqa: E402
from tests.e2e.conftest import wait_job  # noqa: E402

IMAGES = (".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".heic", ".avif", ".gif")
CORPORA = (REPO.parent / "shared" / "corpus", REPO / "tests" / "data")


def corpus(operation: str) -> list[Path]:
    suffixes = (".pdf",) if operation == "pdf_preview" else IMAGES
    files = sorted(
        {
            p.resolve()
            for root in CORPORA
            if root.exists()
            for p in root.rglob("*")
            if p.suffix.lower() in suffixes
        }
    )
    return [p for p in files if 1000 < p.stat().st_size < 50 * MIB]


def camera_photos(directory: Path, megapixels: list[float]) -> list[Path]:
    """One 4:3 JPEG of each size in ``megapixels``, made from the corpus photo
    (:func:`bench.vipswork.make_photos`) in a spawned process."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    with vipswork.vips_pool(1, None) as pool:
        for i, mp in enumerate(megapixels):
            width = round((mp * 1e6 * 4 / 3) ** 0.5)
            (path,) = pool.submit(vipswork.make_photos, str(directory), [i], width, width * 3 // 4).result()
            made.append(Path(path).rename(directory / f"camera-{mp:g}mp.jpg"))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operation", default="thumbnail", choices=("thumbnail", "pdf_preview"))
    parser.add_argument("--photos", default="1,2,4,8,12,24", help="megapixels of camera-size photos added")
    parser.add_argument("--logs", type=Path)
    args = parser.parse_args()
    root = common.temp_root("hm-bench-estimate-")
    files = corpus(args.operation)
    if args.operation == "thumbnail" and args.photos:
        files += camera_photos(root / "photos", [float(mp) for mp in args.photos.split(",")])
    rows = []  # (file, size_mb, estimated, held, charged millicredits, seconds, measures, mime type)
    with (
        common.running_platform(
            root, keep_logs=args.logs, services="credits,storage,gateway,imageworker,docworker"
        ) as bench,
        bench.client() as client,
    ):
        for path in files:
            response = client.post("/v1/objects", files={"file": (path.name, path.read_bytes())})
            if response.status_code != 201:
                continue  # a corpus file the platform refuses at upload (hostile samples)
            obj = response.json()
            body = {"object_id": obj["object_id"], "operations": [args.operation]}
            estimate = client.post("/v1/hypermedia/estimate", json=body)
            if estimate.status_code != 200:
                continue  # not this operation's kind of input
            created = client.post("/v1/hypermedia/process", json=body).json()
            job = wait_job(client, created["job_ids"][0], timeout=300)
            if job["status"] != "completed":
                continue
            rows.append(
                (
                    path.name,
                    obj["size_bytes"] / MIB,
                    round(estimate.json()["estimated_credits"] * 1000),
                    round(job["estimated_credits"] * 1000),
                    round(job["actual_credits"] * 1000),
                    job["attempts"][-1]["duration_ms"] / 1000,
                    facts.measure(facts.of(output["metadata"] for output in job["outputs"])),
                    obj["mime_type"],
                )
            )
    exact = sum(1 for r in rows if r[2] == r[3] == r[4])
    print(
        f"{args.operation}: {len(rows)} corpus files, sizes {min(r[1] for r in rows):.3f}-{max(r[1] for r in rows):.3f} MiB"
    )
    print(f"credits: estimate = hold = charge for {exact} of {len(rows)}")
    # A fresh upload (no job read it: its size only), and an object an earlier job read (its
    # pixels or pages known), each predicted from the others' runs with their measures.
    for label, knows in (("fresh upload", False), ("object read before", True)):
        errors, baseline_errors, within, baseline_within, bases = [], [], 0, 0, Counter[str]()
        for i, (_name, size, *_credits, seconds, measures, mime_type) in enumerate(rows):
            others = [Run(r[1], r[6], r[5], r[7]) for j, r in enumerate(rows) if j != i]
            prediction = choose(others, size, measures if knows else {}, mime_type)
            predicted = prediction.seconds
            median = statistics.median(run.seconds for run in others) if others else None
            if predicted is None or median is None or seconds <= 0:
                continue
            bases[prediction.basis] += 1
            errors.append(abs(predicted - seconds) / seconds)
            baseline_errors.append(abs(median - seconds) / seconds)
            within += predicted / seconds <= 2 and seconds / predicted <= 2
            baseline_within += median / seconds <= 2 and seconds / median <= 2
        if errors:
            mine, base = statistics.median(errors), statistics.median(baseline_errors)
            print(
                f"run time, {label}, leave-one-out: median error {mine:.0%} (baseline: median of the"
                f" others {base:.0%}; ratio {mine / base if base else float('nan'):.2f}), within 2x"
                f" {within}/{len(errors)} (baseline {baseline_within}/{len(errors)}); basis {dict(bases)}"
            )


if __name__ == "__main__":
    main()
