"""Contract tests of the scheduler's ``ec2`` provider (services/scheduler/providers/ec2.py) against
moto's EC2 server, a local server speaking the EC2 API (no AWS account can be used here): a spot
launch from a launch template with its tags, the pool's instances found by tag, terminate; then
whole scheduler cycles on real Postgres launching, adopting, draining and terminating instances.

Opt-in run against real AWS: set ``HM_TEST_EC2_LAUNCH_TEMPLATE`` (a template whose instances may
be started and terminated at once) with credentials and ``AWS_REGION`` in the environment; the
same scenarios then launch real (spot) instances and terminate them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import boto3
import httpx
import pytest

from hypermedia.devtools.embedded import free_port
from services.scheduler.pools import Ec2Options, Pool
from services.scheduler.providers.ec2 import BURST_TAG, POOL_TAG, Ec2Provider
from services.scheduler.scheduler import Scheduler
from tests.integration.conftest import Seeder

REAL_TEMPLATE = os.environ.get("HM_TEST_EC2_LAUNCH_TEMPLATE", "")


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A boto3 EC2 client and a launch template name: moto's server, or real AWS (opt-in)."""
    if REAL_TEMPLATE:
        yield boto3.client("ec2"), REAL_TEMPLATE
        return
    from moto.server import ThreadedMotoServer

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        httpx.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()  # moto's state is per process
        client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
        image = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        client.create_launch_template(
            LaunchTemplateName="hm-burst",
            LaunchTemplateData={"ImageId": image, "InstanceType": "c7g.large"},
        )
        yield client, "hm-burst"
    finally:
        server.stop()


def spot_pool(template: str, **fields: Any) -> Pool:
    return Pool(
        name="images-spot",
        queues=("images",),
        provider="ec2",
        capacity_type="spot",
        slots_per_worker=4,
        max_workers=3,
        boot_seconds=60,
        cost_per_hour=0.05,
        ec2=Ec2Options(launch_template=template),
        **fields,
    )


def instances(client: Any, states: tuple[str, ...] = (), pool: str = "") -> list[dict[str, Any]]:
    """The instances in ``states`` (any when empty) of ``pool`` (any when empty)."""
    filters = [{"Name": "instance-state-name", "Values": list(states)}] if states else []
    filters += [{"Name": f"tag:{POOL_TAG}", "Values": [pool]}] if pool else []
    reply = client.describe_instances(Filters=filters)
    return [i for r in reply["Reservations"] for i in r["Instances"]]


LIVE = ("pending", "running")


async def test_a_spot_launch_is_tagged_found_by_its_pool_and_terminated(ec2: tuple[Any, str]) -> None:
    client, template = ec2
    provider = Ec2Provider(client)
    pool = spot_pool(template)
    burst_id = str(uuid.uuid4())
    ref = await provider.launch(pool, burst_id)
    [raw] = client.describe_instances(InstanceIds=[ref])["Reservations"][0]["Instances"]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[POOL_TAG] == "images-spot" and tags[BURST_TAG] == burst_id
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["InstanceType"] == "c7g.large", "from the launch template"
    [listed] = await provider.list(pool)
    assert (listed.burst_worker_id, listed.provider_ref, listed.state) == (burst_id, ref, "running")
    assert await provider.list(pool.model_copy(update={"name": "other"})) == []
    await provider.terminate(ref)
    await provider.terminate(ref)  # twice: not an error
    described = await provider.describe(ref)
    assert described is not None and described.state == "stopped" and "instance" in described.detail
    assert [i.state for i in await provider.list(pool)] in ([], ["stopped"])
    assert await provider.describe("i-0123456789abcdef0") is None


async def test_scheduler_cycles_launch_adopt_drain_and_terminate_instances(
    ec2: tuple[Any, str], fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    client, template = ec2
    pool = spot_pool(template, idle_seconds=30)
    tenant = await seed.tenant()
    for _ in range(400):
        await seed.job(tenant)
    leader = Scheduler([pool], {"ec2": Ec2Provider(client)}, "host/1")
    async with fresh_pool.acquire() as conn:
        [first] = await leader.run_once(conn)
        # 400 jobs × 1 s (no attempts yet) over the 300 s drain target, plus 400 arrivals over 120 s:
        # 4.67 slots → ceil(4.67 / 3.2) = 2 workers.
        assert (first.target, first.action, first.count) == (2, "start", 2)
        launched = instances(client, LIVE, "images-spot")
        assert len(launched) == 2 and {i["InstanceLifecycle"] for i in launched} == {"spot"}
        rows = await conn.fetch("SELECT burst_worker_id::text AS id, state, provider_ref FROM burst_workers")
        assert {r["state"] for r in rows} == {"booting"}
        by_tag = {
            next(t["Value"] for t in i["Tags"] if t["Key"] == BURST_TAG): i["InstanceId"] for i in launched
        }
        assert by_tag == {r["id"]: r["provider_ref"] for r in rows}

        # A new leader: the booting instances count, nothing is launched twice.
        successor = Scheduler([pool], {"ec2": Ec2Provider(client)}, "host/2")
        [again] = await successor.run_once(conn)
        assert (again.action, again.count) == ("hold", 0), again.reason
        assert len(instances(client, pool="images-spot")) == 2

        # The instances' workers register (as their boot scripts would start them).
        for i, row in enumerate(rows):
            await conn.execute(
                "INSERT INTO workers (worker_id, deployment, boot_id, role, generation, queue, slots, hostname, pid, "
                "status, burst_worker_id) VALUES ($1, 'prod', 'b', 'imageworker', 0, 'images', 4, 'ip', 1, "
                "'running', $2::uuid)",
                f"prod/imageworker/ip-{i}/b/g0/1",
                row["id"],
            )
        await successor.run_once(conn)
        assert {r["state"] for r in await conn.fetch("SELECT state FROM burst_workers")} == {"registered"}

        # The queue is empty and both have been idle past their boot grace: they are drained.
        await conn.execute("DELETE FROM processing_jobs")
        await conn.execute(
            "UPDATE burst_workers SET requested_at = now() - interval '1 hour', last_busy_at = now() - interval '5 minutes'"
        )
        [drained] = await successor.run_once(conn)
        assert (drained.target, drained.action, drained.count) == (0, "drain", 2)
        assert {r["status"] for r in await conn.fetch("SELECT status FROM workers")} == {"draining"}
        assert len(instances(client, LIVE)) == 2, "not before they stop"

        # The workers drained and stopped: only now are the instances terminated.
        await conn.execute("UPDATE workers SET status = 'stopped'")
        await successor.run_once(conn)
        ended = await conn.fetch("SELECT state, reason, terminated_at FROM burst_workers")
        assert {(r["state"], r["reason"]) for r in ended} == {("terminated", "its worker stopped")}
    assert instances(client, LIVE) == []
