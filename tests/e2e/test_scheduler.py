"""The scheduler end to end (issue 20): ``hypermedia up --services …,scheduler`` with no standing
image worker and a local pool, a second scheduler process as its standby, and a flood of 200
thumbnail jobs.

One scenario, run once (each phase needs the one before): the flood starts burst workers; the
leader is killed with SIGKILL after its first start and another scheduler takes over within one
cycle, adopting the workers the dead one launched (no duplicate launch); every job completes
exactly once; every decision, recomputed from the inputs it recorded, is the decision taken; the
spend cap (two workers' worth) holds throughout; a burst worker frozen with SIGSTOP makes the
inputs stale and nothing is drained while they are, although the others are idle; once it runs
again the idle workers are drained through the handshake and terminated, none while it held a job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from selenium.webdriver.common.by import By

from hypermedia.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.scheduler.formula import BurstWorker, Inputs, QueueDemand, plan
from services.scheduler.pools import Pool
from services.scheduler.providers.local import start_ticks
from tests.e2e.browser import follow, open_browser, sign_in, table
from tests.e2e.conftest import REPO, RunningPlatform, isolated_platform, upload, wait_for

INTERVAL = 2.0
JOBS = 200
IMAGE = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"
POOLS = [
    {
        "name": "flood",
        "queues": ["images"],
        "provider": "local",
        "slots_per_worker": 2,
        "max_workers": 3,
        "boot_seconds": 5,
        "idle_seconds": 8,
        "drain_target_seconds": 10,
        "default_job_seconds": 3,
        "cost_per_hour": 1.0,
        "max_spend_per_hour": 2.0,
    }
]


@pytest.fixture(scope="module")
def scheduled(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "sched",
        services="credits,storage,gateway,reaper,scheduler",
        HM_SCHEDULER_POOLS=json.dumps(POOLS),
        HM_SCHEDULER_INTERVAL_SECONDS=str(INTERVAL),
        HM_SCHEDULER_STALE_SECONDS="6",
        HM_SCHEDULER_ARRIVAL_WINDOW_SECONDS="20",
        HM_HEARTBEAT_SECONDS="2",
    ) as running:
        yield running


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def rows(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(sql, args).fetchall()


def recomputed(decision: dict[str, Any]) -> tuple[int, str, int]:
    """The decision :func:`plan` takes from the inputs the scheduler recorded with it."""
    inputs = decision["inputs"]
    again = plan(
        Pool(**inputs["pool"]),
        Inputs(
            demand=tuple(QueueDemand(**d) for d in inputs["demand"]),
            burst=tuple(BurstWorker(**b) for b in inputs["burst"]),
            standing_slots=inputs["standing_slots"],
            stale=inputs["stale"],
            spend_per_hour=inputs["spend_per_hour"],
        ),
    )
    return again.target, again.action, again.count


def test_a_flood_is_worked_off_by_burst_workers_that_follow_the_formula(scheduled: RunningPlatform) -> None:
    dsn = scheduled.info["database_url"]
    host = socket.gethostname()
    leader_pid = int((scheduled.state_dir / "run" / "scheduler.pid").read_text())
    standby_log = (scheduled.state_dir / "logs" / "standby-scheduler.log").open("ab")
    standby = subprocess.Popen(
        [sys.executable, "-m", "services.scheduler"],
        env=environ_of(leader_pid),
        cwd=REPO,
        stdout=standby_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            "the leader's first decision",
            lambda: rows(dsn, "SELECT 1 FROM scaling_decisions WHERE leader = %s", f"{host}/{leader_pid}"),
            30,
        )
        account = scheduled.admin("create-account", "--credits", "10000000")
        with scheduled.client(account) as client:
            obj = upload(client, IMAGE)
            job_ids = []
            for _ in range(JOBS):
                created = client.post(
                    "/v1/hypermedia/process",
                    json={"object_id": obj["object_id"], "operations": ["thumbnail"]},
                )
                assert created.status_code == 202, created.text
                job_ids += created.json()["job_ids"]

        first_start = wait_for(
            "a start decision",
            lambda: rows(
                dsn, "SELECT * FROM scaling_decisions WHERE action = 'start' ORDER BY decision_id LIMIT 1"
            ),
            30,
        )[0]
        assert first_start["leader"] == f"{host}/{leader_pid}"
        # One or two, by how much of the flood the cycle saw; never more: the spend cap is 2.0/h at 1.0/h each.
        assert 1 <= first_start["count"] <= 2, first_start["reason"]
        os.kill(leader_pid, signal.SIGKILL)
        killed_at = rows(dsn, "SELECT now() AS t")[0]["t"]
        # The standby takes the lock at its next try (proven without a clock in
        # tests/integration/test_scheduler.py); here only that it does, and decides.
        wait_for(
            "a decision by another scheduler",
            lambda: rows(
                dsn,
                "SELECT leader, decided_at FROM scaling_decisions WHERE decided_at > %s AND leader <> %s "
                "ORDER BY decision_id LIMIT 1",
                killed_at,
                f"{host}/{leader_pid}",
            ),
            30,
        )

        wait_for(
            f"{JOBS} jobs completed",
            lambda: rows(
                dsn,
                "SELECT 1 FROM processing_jobs HAVING count(*) FILTER (WHERE status = 'completed') = %s",
                JOBS,
            ),
            240,
            interval=0.5,
        )

        # Freeze one burst worker: its heartbeat goes stale, and nothing may be drained meanwhile.
        live = rows(dsn, "SELECT burst_worker_id, provider_ref FROM burst_workers WHERE state = 'registered'")
        assert live, "burst workers are live after the flood"
        frozen = int(live[0]["provider_ref"])
        os.kill(frozen, signal.SIGSTOP)
        try:
            stale_from = wait_for(
                "a decision on stale inputs",
                lambda: rows(
                    dsn,
                    "SELECT decided_at FROM scaling_decisions WHERE inputs->>'stale' <> '' ORDER BY decision_id LIMIT 1",
                ),
                20,
            )[0]["decided_at"]
            time.sleep(POOLS[0]["idle_seconds"] + 2 * INTERVAL)  # every other worker is idle long enough now
            during = rows(
                dsn, "SELECT action, reason FROM scaling_decisions WHERE decided_at >= %s", stale_from
            )
        finally:
            os.kill(frozen, signal.SIGCONT)
        assert during and all(d["action"] != "drain" for d in during), during
        assert any("no scale-down" in d["reason"] for d in during), during
        assert len(rows(dsn, "SELECT 1 FROM burst_workers WHERE state = 'registered'")) == len(live)

        wait_for(
            "every burst worker terminated",
            lambda: not rows(dsn, "SELECT 1 FROM burst_workers WHERE state NOT IN ('terminated', 'failed')"),
            120,
            interval=0.5,
        )
    finally:
        standby.terminate()
        standby.wait(90)
        standby_log.close()

    jobs = rows(dsn, "SELECT status, attempt_count FROM processing_jobs")
    assert len(jobs) == JOBS and {(j["status"], j["attempt_count"]) for j in jobs} == {("completed", 1)}
    attempts = rows(dsn, "SELECT status, count(*) AS n FROM job_attempts GROUP BY 1")
    assert attempts == [{"status": "completed", "n": JOBS}], "once each: nothing lost or handed back"

    decisions = rows(dsn, "SELECT * FROM scaling_decisions ORDER BY decision_id")
    for decision in decisions:
        assert recomputed(decision) == (decision["target"], decision["action"], decision["count"]), decision
    burst = rows(dsn, "SELECT * FROM burst_workers ORDER BY requested_at")
    launched = sum(d["count"] for d in decisions if d["action"] == "start")
    assert len(burst) == launched >= 2, "one burst worker per start counted: no duplicate launch"
    assert len({b["provider_ref"] for b in burst}) == len(burst)
    for b in burst:
        assert b["state"] == "terminated" and b["reason"] == "its worker stopped", b
        assert b["registered_at"] is not None and b["draining_at"] is not None
        assert start_ticks(int(b["provider_ref"])) is None, "the process is gone"
    # Each burst worker's ordinary lane's row (its scheduler consumer has one of its own, ADR 0073).
    workers = rows(dsn, "SELECT burst_worker_id, status FROM workers WHERE queue NOT LIKE 'sched.%%'")
    assert sorted(str(w["burst_worker_id"]) for w in workers) == sorted(
        str(b["burst_worker_id"]) for b in burst
    )
    assert {w["status"] for w in workers} == {"stopped"}
    # The spend cap: never more than two burst workers alive at once.
    events = sorted([(b["requested_at"], 1) for b in burst] + [(b["terminated_at"], -1) for b in burst])
    alive = peak = 0
    for _when, step in events:
        alive += step
        peak = max(peak, alive)
    assert peak <= 2

    # What an operator reads: `hypermedia admin scheduler`.
    report = scheduled.admin("scheduler", "--limit", "1000")
    [pool] = report["pools"]
    assert (pool["name"], pool["live_workers"], pool["launched"], pool["spend_per_hour"]) == (
        "flood",
        0,
        len(burst),
        0,
    )
    costs = {b["burst_worker_id"]: b["cost"] for b in report["burst_workers"]}
    for b in burst:
        hours = (b["terminated_at"] - b["requested_at"]).total_seconds() / 3600
        assert costs[str(b["burst_worker_id"])] == pytest.approx(1.0 * hours, rel=1e-6) and hours > 0
    assert pool["cost"] == pytest.approx(sum(costs.values()), rel=1e-6)
    # The supervisor restarted the killed scheduler, which goes on recording a decision each cycle.
    reported = {d["decision_id"] for d in report["decisions"]}
    assert {d["decision_id"] for d in decisions} <= reported
    assert reported == {
        d["decision_id"]
        for d in rows(dsn, "SELECT decision_id FROM scaling_decisions")
        if d["decision_id"] <= max(reported)
    }


def test_operators_read_pools_burst_workers_and_decisions_over_rest_and_grpc(
    scheduled: RunningPlatform,
) -> None:
    """The operators' API (docs/api.md "Operators") on the running gateway: an admin account reads
    what Postgres holds, over REST and gRPC alike; any other account is refused 403 /
    PERMISSION_DENIED, a missing key 401 / UNAUTHENTICATED."""
    dsn = scheduled.info["database_url"]
    wait_for("a decision", lambda: rows(dsn, "SELECT 1 FROM scaling_decisions"), 30)
    admin = scheduled.admin("create-account", "--admin", "--name", "ops")
    tenant = scheduled.admin("create-account")
    assert (admin["admin"], tenant["admin"]) == (True, False)
    with scheduled.client(admin) as client:
        pools = client.get("/v1/admin/scheduler/pools")
        assert pools.status_code == 200, pools.text
        [pool] = pools.json()["pools"]
        latest = rows(dsn, "SELECT decision_id FROM scaling_decisions ORDER BY decision_id DESC LIMIT 1")[0]
        assert pool["name"] == "flood" and pool["config"]["max_spend_per_hour"] == 2.0
        assert pool["latest_decision"]["decision_id"] <= latest["decision_id"]
        assert pool["launched"] == len(rows(dsn, "SELECT 1 FROM burst_workers WHERE pool = 'flood'"))

        burst = client.get(
            "/v1/admin/scheduler/burst-workers", params={"pool": "flood", "limit": 1000}
        ).json()
        in_db = rows(
            dsn, "SELECT burst_worker_id::text AS id, state FROM burst_workers ORDER BY requested_at DESC"
        )
        assert [(b["burst_worker_id"], b["state"]) for b in burst["burst_workers"]] == [
            (r["id"], r["state"]) for r in in_db
        ]
        live = client.get("/v1/admin/scheduler/burst-workers", params={"live_only": "true"}).json()
        assert all(b["state"] not in ("terminated", "failed") for b in live["burst_workers"])

        first = client.get("/v1/admin/scheduler/decisions", params={"limit": 3}).json()["decisions"]
        assert len(first) == 3 and [d["decision_id"] for d in first] == sorted(
            (d["decision_id"] for d in first), reverse=True
        )
        assert first[0]["inputs"]["pool"]["name"] == "flood" and "demand" in first[0]["inputs"]
        page = client.get(
            "/v1/admin/scheduler/decisions",
            params={"limit": 3, "before_decision_id": first[-1]["decision_id"]},
        ).json()["decisions"]
        assert page and page[0]["decision_id"] < first[-1]["decision_id"]
        bad = client.get("/v1/admin/scheduler/decisions", params={"limit": 5000})
        assert (bad.status_code, bad.json()["error_code"]) == (422, "INVALID_REQUEST")

    # The dashboard's Scheduler page shows the same tables to the admin.
    with open_browser() as browser:
        sign_in(browser, scheduled.rest_url, admin["api_key"])
        follow(browser, browser.find_element(By.LINK_TEXT, "Scheduler"))
        assert table(browser, "#pools", "data-pool")["flood"][0] == "flood"
        decisions = table(browser, "#decisions", "data-decision")
        assert 3 <= len(decisions) <= 50 and max(map(int, decisions)) >= first[0]["decision_id"]
        assert all(row[2] == "flood" and row[3] in ("start", "drain", "hold") for row in decisions.values())

    with scheduled.client(tenant) as client:
        refused = client.get("/v1/admin/scheduler/pools")
        assert (refused.status_code, refused.json()["error_code"]) == (403, "PERMISSION_DENIED")
    with scheduled.client({"api_key": "none"}) as client:
        assert client.get("/v1/admin/scheduler/decisions").status_code == 401

    def grpc_calls(key: str) -> tuple[Any, ...]:
        metadata = (("authorization", f"Bearer {key}"),)
        with grpc.insecure_channel(scheduled.grpc_addr) as chan:
            stub = scheduler_pb2_grpc.SchedulerAdminServiceStub(chan)
            return (
                stub.ListPools(scheduler_pb2.ListPoolsRequest(), metadata=metadata, timeout=10),
                stub.ListBurstWorkers(
                    scheduler_pb2.ListBurstWorkersRequest(pool="flood", limit=1000),
                    metadata=metadata,
                    timeout=10,
                ),
                stub.ListScalingDecisions(
                    scheduler_pb2.ListScalingDecisionsRequest(limit=2), metadata=metadata, timeout=10
                ),
            )

    pools_reply, burst_reply, decisions_reply = grpc_calls(admin["api_key"])
    assert [p.name for p in pools_reply.pools] == ["flood"]
    assert pools_reply.pools[0].launched == pool["launched"]
    assert [b.burst_worker_id for b in burst_reply.burst_workers] == [r["id"] for r in in_db]
    for b in burst_reply.burst_workers:
        assert b.requested_at.seconds > 0 and b.cost >= 0
    assert len(decisions_reply.decisions) == 2
    assert json_format.MessageToDict(decisions_reply.decisions[0].inputs)["pool"]["name"] == "flood"
    with pytest.raises(grpc.RpcError) as denied:
        grpc_calls(tenant["api_key"])
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as unknown:
        grpc_calls("hm_000000000000_nope")
    assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
