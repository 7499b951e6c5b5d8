"""All benchmarks (``make bench``): thumbnail throughput and per-job overhead, each against a
baseline measured in the same run, then a summary table. Ratios, never timed assertions.

    .venv/bin/python bench/run.py [--quick] [--logs DIR]

``--quick``: 8 photos × 1 round and 20 tiny jobs (a smoke run, about two minutes).
See docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, job_overhead, thumbnail_throughput  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platforms' service logs here")
    args = parser.parse_args(argv)
    count, rounds, jobs = (8, 1, 20) if args.quick else (24, 3, 100)
    logs = args.logs

    tp = thumbnail_throughput.run(
        count=count,
        rounds=rounds,
        keep_logs=logs / "throughput" if logs else None,
    )
    print()
    oh = job_overhead.run(count=jobs, keep_logs=logs / "overhead" if logs else None)
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
    print(common.table(rows, ("benchmark", "baseline", "platform", "ratio", "note")))
    print(
        f"background load from other processes: {tp['background_cores']:.2f} cores (throughput, median), "
        f"{oh['background_cores']:.2f} cores (overhead)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
