"""Fairness within a band (issue 21 item 4, ADR 0059): how long tenant B's one job waits behind
tenant A's flood of ``--flood`` jobs of the same queue and priority, against B's wait on an idle
queue measured in the same run.

    .venv/bin/python bench/fairness.py [--flood 1000] [--rounds 3] [--logs DIR]

A private platform (credits, storage, gateway; ``noop`` enabled, 100 operations a request) and one
imageworker of 4 slots started by the benchmark. Per round: B's job alone (baseline), then A's
flood created through REST (10 requests of 100 no-op jobs at priority 5) and, right after it, B's
one job at priority 5. Printed per round: B's created → started with the flood and alone, their
ratio, and how many of A's jobs started while B's waited (from its creation to its start).

**Goal (issue 21):** B is not held back by more than the time of a few jobs. Without fairness
B's job would start after all of A's (JetStream keeps publish order within a subject); with
each account's window of ``FAIR_WINDOW`` published jobs per subject, B's starts after at most
``FAIR_WINDOW`` of A's plus the slots' batch: MET when A's jobs started while B's waited ≤
``FAIR_WINDOW + SLOTS`` in every round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, job_throughput  # noqa: E402
from hypermedia.jobs.lifecycle import FAIR_WINDOW  # noqa: E402

PHOTO = REPO / "tests" / "data" / "exif-orientation" / "Landscape_1.jpg"
PRIORITY = 5


def _noop(client: httpx.Client, object_id: str, count: int) -> list[str]:
    response = client.post(
        "/v1/hypermedia/process",
        json={"object_id": object_id, "operations": ["noop"] * count, "priority": PRIORITY},
    )
    if response.status_code != 202:
        raise RuntimeError(f"process answered {response.status_code}: {response.text}")
    return list(response.json()["job_ids"])


def _timing(dsn: str, job_id: str) -> dict[str, Any]:
    [row] = common.job_timings(dsn, [job_id])
    return row


def _started_between(dsn: str, job_ids: list[str], after: float, before: float) -> int:
    """How many of ``job_ids`` started in (``after``, ``before``): A's jobs that went first while
    B's waited."""
    return sum(
        1
        for t in common.job_timings(dsn, job_ids)
        if t["attempt_started"] and after < t["attempt_started"] < before
    )


def run(flood: int, rounds: int, logs: Path | None = None) -> dict[str, Any]:
    """The rounds, printed; returns ``wait_ms`` and ``alone_ms`` (medians), ``ahead`` (the most
    of A's jobs that started while B's waited) and ``met``."""
    root = common.temp_root("hm-bench-fairness-")
    env = {"HM_NOOP_OPERATION": "1", "HM_MAX_OPERATIONS": "100"}
    met = True
    rows = []
    waits: list[float] = []
    alones: list[float] = []
    aheads: list[int] = []
    with common.running_platform(root, env=env, services="credits,storage,gateway", keep_logs=logs) as bp:
        other = bp.platform.admin("create-account", "--credits", "1000000")
        bp.platform.admin("set-quota", other["account_id"], "--rate", "100000", "--burst", "1000000")
        with (
            job_throughput.workers(bp, 1),
            bp.client() as a,
            httpx.Client(
                base_url=bp.platform.rest_url,
                headers={"Authorization": f"Bearer {other['api_key']}"},
                timeout=60,
            ) as b,
        ):
            a_object = common.upload(a, PHOTO)["object_id"]
            b_object = common.upload(b, PHOTO)["object_id"]
            for _ in range(rounds):
                alone = _noop(b, b_object, 1)[0]
                common.wait_all_terminal(bp.dsn, [alone], 60)
                flooded = []
                for _ in range(0, flood, 100):
                    flooded += _noop(a, a_object, min(100, flood - len(flooded)))
                behind = _noop(b, b_object, 1)[0]
                common.wait_all_terminal(bp.dsn, [behind, *flooded], 600)
                t_alone, t_behind = _timing(bp.dsn, alone), _timing(bp.dsn, behind)
                wait_alone = t_alone["attempt_started"] - t_alone["created"]
                wait_behind = t_behind["attempt_started"] - t_behind["created"]
                ahead = _started_between(bp.dsn, flooded, t_behind["created"], t_behind["attempt_started"])
                ok = ahead <= FAIR_WINDOW + job_throughput.SLOTS
                waits.append(wait_behind * 1000)
                alones.append(wait_alone * 1000)
                aheads.append(ahead)
                met = met and ok
                rows.append(
                    [
                        f"{wait_behind * 1000:.0f} ms",
                        f"{wait_alone * 1000:.0f} ms",
                        f"{wait_behind / max(wait_alone, 1e-3):.1f}x",
                        ahead,
                        "MET" if ok else "MISSED",
                    ]
                )
                time.sleep(1)
    print(
        f"fairness: B's one job behind A's {flood} no-op jobs (priority {PRIORITY}, 1 imageworker x "
        f"{job_throughput.SLOTS} slots, FAIR_WINDOW {FAIR_WINDOW}); {common.machine()}"
    )
    print(
        common.table(
            rows,
            ["B waited (flood)", "B waited (alone)", "ratio", "A's jobs started while B's waited", "goal"],
        )
    )
    print(
        f"goal: A's jobs started while B's waited <= {FAIR_WINDOW + job_throughput.SLOTS}: {'MET' if met else 'MISSED'}"
    )
    return {
        "wait_ms": statistics.median(waits),
        "alone_ms": statistics.median(alones),
        "ahead": max(aheads),
        "met": met,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood", type=int, default=1000, help="tenant A's jobs (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--logs", type=Path, default=None, help="copy the platform's service logs here")
    args = parser.parse_args(argv)
    run(args.flood, args.rounds, args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
