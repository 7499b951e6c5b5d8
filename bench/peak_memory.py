"""Peak memory per operation, measured (issue 19: the unit's autoscaler sizes a job from
``job_attempts.peak_memory_mb``, not from a guess): every operation of the shipped profiles on
inputs of the sizes it is for, through the whole platform, and the p50 / p95 / max of the peak
each attempt's sandbox recorded (the job cgroup's ``memory.peak``, v1 ``max_usage_in_bytes``; else
the child's ``ru_maxrss``), against the profile's ``memory_limit_mb``.

    .venv/bin/python bench/peak_memory.py [--jobs 20] [--logs DIR]

``--jobs`` attempts per operation (20 is what the autoscaler needs before it trusts an operation's
p95: ``hypermedia/worker/unit/evidence.py``). Inputs: a 4000×3000 JPEG (images), the corpus PDFs
and the ODT (documents), the corpus TIFF page (ocr), 20 s of generated 720p video with audio and 60 s
of audio (media). The table goes into docs/operations.md ("Per-job memory, measured").

The goal is the issue's rule, not a speed: a profile's limit must cover its measured p95 (MET),
or the autoscaler's sizing from the profile would under-count (MISSED).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, media, thumbnail_throughput  # noqa: E402

DATA = REPO / "tests" / "data"


def cases(inputs: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(operation, input, params) of every shipped operation."""
    [photo] = thumbnail_throughput.make_images(inputs / "photos", 1)
    video, audio = inputs / "clip.mp4", inputs / "tone.wav"
    media.make_video(video, 20.0)
    media.make_audio(audio, 60.0)
    pdf = DATA / "pdf" / "pdflatex-4-pages.pdf"
    return [
        ("thumbnail", photo, {"size": 256}),
        ("resize", photo, {"width": 1600}),
        ("compress", photo, {}),
        ("convert", photo, {"format": "png"}),
        ("pdf_info", pdf, {}),
        ("pdf_preview", pdf, {}),
        ("text_extract", pdf, {}),
        ("office_to_pdf", DATA / "office" / "libre-office-writer.odt", {}),
        ("ocr", DATA / "ocr" / "phototest.tif", {}),
        ("probe", video, {}),
        ("poster", video, {}),
        ("waveform", audio, {}),
        ("transcode_audio", audio, media.audio_params("aac", False)),
        ("transcode_video", video, media.video_params([360])),
    ]


def run(jobs: int, keep_logs: Path | None = None) -> list[dict[str, Any]]:
    root = common.temp_root("hm-bench-peak-")
    try:
        specs = cases(root / "inputs")
        with common.running_platform(root, keep_logs=keep_logs) as bp, bp.client(timeout=120) as client:
            ids: dict[str, list[str]] = {}
            for operation, path, params in specs:
                object_id = common.upload(client, path)["object_id"]
                for _ in range(jobs):
                    response = client.post(
                        "/v1/hypermedia/process",
                        json={"object_id": object_id, "operations": [{"name": operation, "params": params}]},
                    )
                    response.raise_for_status()
                    ids.setdefault(operation, []).extend(response.json()["job_ids"])
            every = [job_id for group in ids.values() for job_id in group]
            common.wait_all_terminal(bp.dsn, every, timeout=60 * 60)
            return _measured(bp.dsn, list(ids))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measured(dsn: str, operations: list[str]) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT j.operation, count(*) FILTER (WHERE a.status = 'completed') AS completed,
                   count(*) FILTER (WHERE a.status <> 'completed') AS other,
                   percentile_disc(0.5) WITHIN GROUP (ORDER BY a.peak_memory_mb) AS p50,
                   percentile_disc(0.95) WITHIN GROUP (ORDER BY a.peak_memory_mb) AS p95,
                   max(a.peak_memory_mb) AS max,
                   max(p.memory_limit_mb) AS limit_mb
            FROM job_attempts a JOIN processing_jobs j USING (job_id)
            JOIN processing_profiles p ON p.operation = j.operation AND p.version = j.profile_version
            GROUP BY j.operation
            """
        ).fetchall()
    found = {r[0]: r for r in rows}
    return [
        dict(
            zip(("operation", "completed", "other", "p50", "p95", "max", "limit_mb"), found[op], strict=True)
        )
        for op in operations
        if op in found
    ]


def report(rows: list[dict[str, Any]]) -> bool:
    """Print the table; True when every limit covers its p95."""
    table = [
        (
            r["operation"],
            r["completed"],
            r["other"],
            r["p50"],
            r["p95"],
            r["max"],
            r["limit_mb"],
            f"{(r['p95'] or 0) / r['limit_mb']:.2f}" if r["limit_mb"] else "-",
            "MET" if r["limit_mb"] and (r["p95"] or 0) <= r["limit_mb"] else "MISSED",
        )
        for r in rows
    ]
    print(
        common.table(
            table,
            (
                "operation",
                "completed",
                "other",
                "p50 MiB",
                "p95 MiB",
                "max MiB",
                "limit MiB",
                "p95/limit",
                "limit ≥ p95",
            ),
        )
    )
    return all(row[-1] == "MET" for row in table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20, help="attempts per operation")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platform's service logs here")
    args = parser.parse_args(argv)
    print(f"peak memory per operation: {args.jobs} jobs each, {common.machine()}")
    report(run(args.jobs, args.logs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
