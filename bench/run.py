"""All benchmarks (``make bench``): thumbnail throughput, per-job overhead, office_to_pdf (warm
LibreOffice listeners against a cold ``soffice`` per document) and OCR (the ``ocr`` queue against
bare ``tesseract`` processes, and the CER of each corpus page), each against a baseline measured in
the same run, then a summary table. Ratios, never timed assertions.

    .venv/bin/python bench/run.py [--quick] [--logs DIR]

``--quick``: 8 photos × 1 round, 20 tiny jobs, 4 office documents × 1 round and 8 OCR pages × 1
round (a smoke run, about five minutes). office_to_pdf is skipped, with a message, without
LibreOffice, and OCR without tesseract. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, job_overhead, ocr, office_to_pdf, thumbnail_throughput  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platforms' service logs here")
    args = parser.parse_args(argv)
    count, rounds, jobs, documents, pages = (8, 1, 20, 4, 8) if args.quick else (24, 3, 100, 8, 24)
    logs = args.logs

    tp = thumbnail_throughput.run(
        count=count,
        rounds=rounds,
        keep_logs=logs / "throughput" if logs else None,
    )
    print()
    oh = job_overhead.run(count=jobs, keep_logs=logs / "overhead" if logs else None)
    print()
    office = office_to_pdf.run(
        rounds=rounds, documents=documents, keep_logs=logs / "office_to_pdf" if logs else None
    )
    print()
    ocr_result = ocr.run(rounds=rounds, pages=pages, keep_logs=logs / "ocr" if logs else None)
    print()
    print(f"summary ({common.machine()}):")
    rows = [
        (
            f"thumbnail throughput ({count} x 12 MP, img/s)",
            tp["baseline_ips"],
            tp["platform_ips"],
            f"{tp['ratio']:.2f}x",
            "goal >= 0.8x: " + ("met" if tp["ratio"] >= thumbnail_throughput.GOAL else "MISSED"),
        ),
        (
            f"job latency p50 ({jobs} tiny jobs, ms)",
            oh["bare_ms"],
            oh["created_completed_p50_ms"],
            f"{oh['ratio']:.0f}x",
            f"+{oh['overhead_ms']:.0f} ms per job (created->completed)",
        ),
        (
            "job latency p99 (ms)",
            oh["bare_p99_ms"],
            oh["created_completed_p99_ms"],
            f"{oh['created_completed_p99_ms'] / oh['bare_ms']:.0f}x",
            f"client-observed p50 {oh['client_p50_ms']:.0f} ms, p99 {oh['client_p99_ms']:.0f} ms",
        ),
    ]
    if office is not None:
        for kind in office["kinds"]:
            ratio = office["platform_ratio"][kind]
            rows.append(
                (
                    f"office_to_pdf latency {kind} (s)",
                    office["cold_s"][kind],
                    office["platform_s"][kind],
                    f"{ratio:.2f}x",
                    f"goal <= {office_to_pdf.GOAL}x: {'met' if ratio <= office_to_pdf.GOAL else 'MISSED'}; "
                    f"warm engine alone {office['engine_ratio'][kind]:.2f}x",
                )
            )
        rows.append(
            (
                f"office_to_pdf throughput ({documents} docs, docs/min)",
                office["cold_dpm"],
                office["platform_dpm"],
                f"{office['throughput_ratio']:.1f}x",
                "baseline: cold soffice 2 at a time",
            )
        )
    if ocr_result is not None:
        if ocr_result["ratio"] is not None:
            rows.append(
                (
                    f"ocr throughput ({pages} pages, pages/min)",
                    ocr_result["bare_ppm"],
                    ocr_result["platform_ppm"],
                    f"{ocr_result['ratio']:.2f}x",
                    f"goal >= {ocr.GOAL}x: {'met' if ocr_result['ratio'] >= ocr.GOAL else 'MISSED'}; "
                    f"engine + preprocessing alone {ocr_result['engine_ratio']:.2f}x; CPU per page "
                    f"bare / platform {ocr_result['cpu_ratio']:.2f}x",
                )
            )
        for page, rates in ocr_result["cer"].items():
            rows.append(
                (
                    f"ocr CER {page}",
                    ocr.pct(rates["bare"]),
                    ocr.pct(rates["escalation"]),
                    "",
                    "bare tesseract -> the engine with preprocessing and escalation (without escalation "
                    f"{ocr.pct(rates['preprocessed'])}, without preprocessing {ocr.pct(rates['engine'])})",
                )
            )
    print(common.table(rows, ("benchmark", "baseline", "platform", "ratio", "note")))
    print(
        f"background load from other processes: {tp['background_cores']:.2f} cores (throughput, median), "
        f"{oh['background_cores']:.2f} cores (overhead)"
        + (f", {office['background_cores']:.2f} cores (office_to_pdf)" if office is not None else "")
        + (f", {ocr_result['background_cores']:.2f} cores (ocr)" if ocr_result is not None else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
