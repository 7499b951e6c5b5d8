"""A capacity model of hypermedia at 1, 10 and 100 million jobs a day (issue 24 item 5).

    .venv/bin/python bench/capacity_model.py [--rows FILE] [--seed 1] [--json FILE]

Fed with figures measured on this machine (each :class:`Figure` names the benchmark and the date
it comes from) and with assumptions where nothing was measured (each marked ``assumed``, with
its reason); docs/scale.md reads the output. Two parts:

* **Worker pools, by a discrete-event simulation.** Per queue, jobs arrive as a Poisson process
  at the peak rate of the day's volume times the queue's share of the mix, and are served
  first come, first served by ``c`` slots (one slot a core), each job taking a log-normal time
  with the class's measured mean CPU seconds and an assumed coefficient of variation. The model
  searches the fewest slots whose simulated 95th percentile of queue wait meets the queue's
  target, and reports them with the worker pods (:data:`POD_CORES` cores each) they make.
* **Shared parts, from rates.** At the peak rate: Postgres commits, rows and WAL bytes a second
  (``bench/rows_per_job.py``), CPU cores of every platform service (``bench/thumbnail_throughput.py``'s
  P3 table), JetStream messages a second, and bytes in and out. Each part that is one instance
  in the deployment (the Postgres primary, one JetStream stream per queue) is set against an
  assumed capacity; the first to pass it is the first bottleneck.

The simulation is seeded, so a run prints the same tables for the same inputs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common  # noqa: E402

VOLUMES = (1_000_000, 10_000_000, 100_000_000)
"""Jobs a day the model is run for (the issue's three)."""


@dataclass(frozen=True)
class Figure:
    """A number the model uses, with where it comes from: a measurement (``source`` names the
    benchmark and date) or an assumption (``assumed`` True, ``source`` says why this value)."""

    value: float
    source: str
    assumed: bool = False


PEAK_FACTOR = Figure(
    3.0, "the busiest hour's rate over the day's average; no traffic measured yet", assumed=True
)
POD_CORES = Figure(4, "cores of one worker pod (one slot a core, the workers' default)", assumed=True)
MAX_UTILISATION = Figure(
    0.85,
    "headroom above the busiest hour's mean: bursts within the hour, and pods that take a minute to start",
    assumed=True,
)
SIMULATED_JOBS = 20_000
"""Jobs per simulation run: enough for a stable 95th percentile at every pool size here."""


@dataclass(frozen=True)
class JobClass:
    """One kind of job in the mix."""

    name: str
    queue: str
    share: Figure
    """Its fraction of the day's jobs."""
    engine_cpu_seconds: Figure
    """CPU seconds of the engine's work per job (the sandbox children), one core."""
    cv: Figure
    """Coefficient of variation of its run time (standard deviation over mean)."""
    wait_target_seconds: Figure
    """The 95th percentile of queue wait the pool is sized for."""
    input_mb: Figure
    output_mb: Figure


CLASSES = (
    JobClass(
        "thumbnail (12 MP photo)",
        "images",
        Figure(0.85, "the seed says images mostly and names no mix", assumed=True),
        Figure(0.0681, "bench/thumbnail_throughput.py 2026-12-06: sandbox job children, median of 4 rounds"),
        Figure(0.5, "photos of one size vary little; other sizes shift the mean", assumed=True),
        Figure(1.0, "interactive thumbnails", assumed=True),
        Figure(2.9, "bench/thumbnail_throughput.py: the 12 MP test JPEGs"),
        Figure(0.01, "a 256 px WebP is 5-15 KB", assumed=True),
    ),
    JobClass(
        "pdf_preview (1 page, 96 dpi)",
        "documents",
        Figure(0.08, "documents second in the seed's list", assumed=True),
        Figure(0.060, "docs/performance.md, PDF preview: about 60 ms of CPU a page in the job processes"),
        Figure(1.0, "documents vary widely", assumed=True),
        Figure(5.0, "a preview shown after an upload", assumed=True),
        Figure(0.5, "a typical office PDF", assumed=True),
        Figure(0.03, "a 96 dpi WebP page", assumed=True),
    ),
    JobClass(
        "ocr (3 pages)",
        "ocr",
        Figure(0.05, "OCR as a smaller part of the document traffic", assumed=True),
        Figure(
            5.55,
            "docs/performance.md, OCR: 1.85 CPU s a page in the job children (measured), × 3 pages",
            assumed=True,
        ),
        Figure(0.6, "pages differ in size and escalation", assumed=True),
        Figure(30.0, "OCR is background work", assumed=True),
        Figure(1.0, "a 3-page scan", assumed=True),
        Figure(0.05, "text, words, hOCR", assumed=True),
    ),
    JobClass(
        "transcode_video (60 s, 1080p → 720p)",
        "media",
        Figure(0.02, "the seed's media as the smallest part", assumed=True),
        Figure(
            34.2,
            "docs/performance.md, media: 11.4 CPU s per 20 s of 1080p → 720p (measured), × 60 s clips",
            assumed=True,
        ),
        Figure(1.0, "clip lengths vary widely", assumed=True),
        Figure(60.0, "a transcode after an upload", assumed=True),
        Figure(60.0, "60 s of 1080p at 8 Mbit/s", assumed=True),
        Figure(
            13.0, "60 s of 720p at 1.7 Mbit/s (docs/performance.md's output rate), 60 s clips", assumed=True
        ),
    ),
)

PLATFORM_CPU_MS = {
    "gateway": Figure(6.7, "bench/thumbnail_throughput.py 2026-12-06, P3 table, median of 4 rounds"),
    "storage": Figure(8.1, "same run"),
    "credits": Figure(4.4, "same run"),
    "worker (execution + zygote)": Figure(14.1, "same run: imageworker 10.8 + sandbox zygote 3.3"),
    "postgres": Figure(8.3, "same run"),
    "nats": Figure(2.7, "same run"),
}
"""CPU milliseconds per job outside the engine, per service: measured for thumbnails and used for
every class (assumed: the other classes' per-job platform work is of the same calls)."""

ROWS_DEFAULT: dict[str, Any] = {
    "rows_per_job": 21.81,
    "commits": 15.18,
    "write_commits": 6.79,
    "wal_bytes": 10875,
    "stream_messages": {"IMAGES": 1.0},
    "source": "bench/rows_per_job.py 2026-12-06 20:11 UTC, 200 thumbnails, idle writes subtracted",
}
JETSTREAM_OPS_PER_MESSAGE = Figure(
    3.0, "a publish, a pull that delivers it and its ack; doorbells and empty pulls not counted", assumed=True
)

CAPACITY = {
    "postgres primary commits/s": Figure(
        30_000.0,
        "durable commits (a transaction that wrote) a second: group commit on NVMe with"
        " synchronous_commit on; not measured here",
        assumed=True,
    ),
    "postgres primary CPU cores": Figure(
        32.0, "a large managed primary (64 vCPU) kept at half its CPU for failover headroom", assumed=True
    ),
    "postgres WAL MB/s": Figure(
        100.0, "sustained WAL a managed primary and its replicas keep up with", assumed=True
    ),
    "jetstream messages/s per stream (R3, file)": Figure(
        20_000.0, "a replicated file stream's publish+ack rate; not measured here", assumed=True
    ),
}


@dataclass
class PoolSize:
    queue: str
    rate: float
    busy_cores: float
    slots: int
    pods: int
    p95_wait: float
    mean_wait: float


@dataclass
class Result:
    volume: int
    peak_rate: float
    pools: list[PoolSize] = field(default_factory=list)
    shared: dict[str, float] = field(default_factory=dict)
    utilisation: dict[str, float] = field(default_factory=dict)


def simulate(
    rate: float, mean: float, cv: float, slots: int, jobs: int, rng: random.Random
) -> tuple[float, float]:
    """First come, first served on ``slots`` servers, Poisson arrivals at ``rate`` a second,
    log-normal service times of ``mean`` seconds and coefficient of variation ``cv``; returns the
    95th percentile and the mean of the queue waits of ``jobs`` jobs (seconds), the first tenth
    dropped as warm-up."""
    sigma = math.sqrt(math.log(1 + cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    free = [0.0] * slots  # when each slot is next free: a heap
    now, waits = 0.0, []
    for _ in range(jobs):
        now += rng.expovariate(rate)
        start = max(now, heapq.heappop(free))
        waits.append(start - now)
        heapq.heappush(free, start + rng.lognormvariate(mu, sigma))
    kept = sorted(waits[jobs // 10 :])
    return kept[int(0.95 * (len(kept) - 1))], sum(kept) / len(kept)


def size_pool(job: JobClass, rate: float, seed: int) -> PoolSize:
    """The fewest slots, at most :data:`MAX_UTILISATION` busy on average, whose simulated p95
    queue wait meets the class's target. (A short simulation of a pool near full utilisation
    would not show its queue growing; the cap is what keeps such a pool stable.)"""
    mean, cv, target = job.engine_cpu_seconds.value, job.cv.value, job.wait_target_seconds.value
    busy = rate * mean
    low = max(1, math.ceil(busy / MAX_UTILISATION.value))
    high = max(low + 1, math.ceil(busy * 1.5) + 2)
    while simulate(rate, mean, cv, high, SIMULATED_JOBS, random.Random(seed))[0] > target:
        low, high = high, high * 2
    while low < high:  # the simulation is seeded: p95 falls as slots grow, so bisect
        mid = (low + high) // 2
        if simulate(rate, mean, cv, mid, SIMULATED_JOBS, random.Random(seed))[0] <= target:
            high = mid
        else:
            low = mid + 1
    p95, mean_wait = simulate(rate, mean, cv, high, SIMULATED_JOBS, random.Random(seed))
    pods = math.ceil(high / POD_CORES.value)
    return PoolSize(job.queue, rate, busy, high, pods, p95, mean_wait)


def model(volume: int, rows: dict[str, Any], seed: int, peak_factor: float = PEAK_FACTOR.value) -> Result:
    """Pools and shared parts at the peak hour of ``volume`` jobs a day."""
    peak = volume / 86_400 * peak_factor
    result = Result(volume, peak)
    for job in CLASSES:
        result.pools.append(size_pool(job, peak * job.share.value, seed))
    messages = peak * sum(rows["stream_messages"].values())
    result.shared = {
        "postgres writing transactions/s": peak * rows["write_commits"],
        "postgres transactions/s, reads included": peak * rows["commits"],
        "postgres rows written/s": peak * rows["rows_per_job"],
        "postgres WAL MB/s": peak * rows["wal_bytes"] / 1e6,
        "jetstream messages/s": messages,
        "jetstream API operations/s": messages * JETSTREAM_OPS_PER_MESSAGE.value,
        "ingress to storage MB/s (uploads)": peak * sum(j.share.value * j.input_mb.value for j in CLASSES),
        "egress MB/s (outputs read once)": peak * sum(j.share.value * j.output_mb.value for j in CLASSES),
        "worker ↔ storage MB/s (input down, outputs up)": peak
        * sum(j.share.value * (j.input_mb.value + j.output_mb.value) for j in CLASSES),
    }
    for service, cpu in PLATFORM_CPU_MS.items():
        result.shared[f"{service} cores"] = peak * cpu.value / 1000
    busiest_stream = peak * max(j.share.value for j in CLASSES)
    result.utilisation = {
        "postgres primary commits/s": result.shared["postgres writing transactions/s"]
        / CAPACITY["postgres primary commits/s"].value,
        "postgres primary CPU cores": result.shared["postgres cores"]
        / CAPACITY["postgres primary CPU cores"].value,
        "postgres WAL MB/s": result.shared["postgres WAL MB/s"] / CAPACITY["postgres WAL MB/s"].value,
        "jetstream messages/s per stream (R3, file)": busiest_stream
        / CAPACITY["jetstream messages/s per stream (R3, file)"].value,
    }
    return result


def report(results: list[Result], rows: dict[str, Any]) -> str:
    out = [
        f"capacity model from figures measured on a {common.machine()} machine;"
        f" Postgres and JetStream per job: {rows.get('source', 'a file without its source')}"
    ]
    header = ["", *(f"{r.volume / 1e6:g} M/day" for r in results)]
    out.append(
        f"\npeak rate (× {results[0].peak_rate / (results[0].volume / 86_400):g} the day's average): "
        + ", ".join(f"{r.peak_rate:,.0f} jobs/s" for r in results)
    )
    out.append(
        f"\nworker pools (simulated; slots = cores, pods of {POD_CORES.value:g}, at most"
        f" {MAX_UTILISATION.value:g} of the slots busy):"
    )
    lines = []
    for i, job in enumerate(CLASSES):
        lines.append(
            (
                f"{job.queue}: {job.name}, p95 wait ≤ {job.wait_target_seconds.value:g} s",
                *(
                    f"{r.pools[i].slots} slots / {r.pools[i].pods} pod{'s' if r.pools[i].pods != 1 else ''}"
                    f" (busy {r.pools[i].busy_cores:.1f}, p95 {r.pools[i].p95_wait:.2f} s)"
                    for r in results
                ),
            )
        )
    out.append(common.table(lines, header))
    out.append("\nshared parts at the peak:")
    out.append(
        common.table([(k, *(f"{r.shared[k]:,.1f}" for r in results)) for k in results[0].shared], header)
    )
    out.append("\nsingle instances against their assumed capacity (1.0 = full):")
    out.append(
        common.table(
            [(k, *(f"{r.utilisation[k]:.2f}" for r in results)) for k in results[0].utilisation], header
        )
    )
    for r in results:
        over = [k for k, v in r.utilisation.items() if v > 1.0]
        worst = max(r.utilisation, key=lambda k: r.utilisation[k])
        verdict = (
            f"over capacity: {', '.join(over)}"
            if over
            else f"nothing over capacity; closest: {worst} at {r.utilisation[worst]:.2f}"
        )
        out.append(f"  {r.volume / 1e6:g} M/day: {verdict}")
    return "\n".join(out)


def sources() -> str:
    """Every input :class:`Figure` of the model with its value, whether it is assumed, and its source."""
    named: list[tuple[str, Figure]] = [("peak factor", PEAK_FACTOR), ("cores a pod", POD_CORES)]
    named.append(("utilisation cap", MAX_UTILISATION))
    for job in CLASSES:
        for attr in ("share", "engine_cpu_seconds", "cv", "wait_target_seconds", "input_mb", "output_mb"):
            named.append((f"{job.queue}: {attr}", getattr(job, attr)))
    named += [(f"platform CPU ms a job: {k}", v) for k, v in PLATFORM_CPU_MS.items()]
    named += [("JetStream operations a message", JETSTREAM_OPS_PER_MESSAGE)]
    named += [(f"capacity: {k}", v) for k, v in CAPACITY.items()]
    rows = [(name, f"{f.value:g}", "assumed" if f.assumed else "measured", f.source) for name, f in named]
    return common.table(rows, ["input", "value", "kind", "source"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=Path, help="bench/rows_per_job.py --json output (default: the figures of 2026-12-06)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the simulation's random seed (default 1)")
    parser.add_argument(
        "--peak-factor",
        type=float,
        default=PEAK_FACTOR.value,
        help=f"the busiest hour's rate over the day's average (default {PEAK_FACTOR.value:g}, assumed)",
    )
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--sources", action="store_true", help="also print every input with its source")
    args = parser.parse_args(argv)
    try:
        rows = json.loads(args.rows.read_text()) if args.rows else ROWS_DEFAULT
        (
            float(rows["rows_per_job"]),
            float(rows["commits"]),
            float(rows["write_commits"]),
            float(rows["wal_bytes"]),
        )
        sum(float(n) for n in rows["stream_messages"].values())
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        parser.error(f"--rows {args.rows}: not bench/rows_per_job.py --json output ({exc!r})")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: no such directory")
    if not 0 < args.peak_factor <= 24:
        parser.error("--peak-factor must be above 0 and at most 24")
    results = [model(volume, rows, args.seed, args.peak_factor) for volume in VOLUMES]
    print(report(results, rows))
    if args.sources:
        print("\n" + sources())
    if args.json:
        args.json.write_text(
            json.dumps([r.__dict__ | {"pools": [p.__dict__ for p in r.pools]} for r in results], indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
