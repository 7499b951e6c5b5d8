"""The ``ec2`` provider: one EC2 instance per burst worker, launched from the pool's launch
template with boto3, spot through ``InstanceMarketOptions``.

Each instance is tagged ``hypermedia-pool`` and ``hypermedia-burst-worker-id`` (and ``Name``),
which is how :meth:`Ec2Provider.list` finds a pool's instances after a leader change, and how the
instance's boot script learns its ``HM_BURST_WORKER_ID`` (from the instance metadata's tags: the
launch template must set ``MetadataOptions.InstanceMetadataTags=enabled``). boto3 is blocking:
every call runs in a thread. Errors are botocore's ``ClientError`` (the scheduler records them on
the burst worker). Tested against moto's EC2 (tests/contract/test_scheduler_ec2.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from botocore.exceptions import ClientError

from services.scheduler.pools import Pool
from services.scheduler.providers import Instance

POOL_TAG = "hypermedia-pool"
BURST_TAG = "hypermedia-burst-worker-id"
RUNNING_STATES = ("pending", "running")
"""Instance states that count as a live worker; ``stopping``/``stopped``/``shutting-down`` do not
(a burst worker's instance is never restarted: it is replaced)."""


class Ec2Provider:
    """Burst workers as EC2 instances, through ``client`` (a boto3 EC2 client)."""

    name = "ec2"

    def __init__(self, client: Any) -> None:
        self._ec2 = client

    async def launch(self, pool: Pool, burst_worker_id: str) -> str:
        """``run_instances`` of one instance from the pool's launch template; returns its id."""
        assert pool.ec2 is not None, "an ec2 pool has its ec2 options (Pool validates it)"
        template_key = (
            "LaunchTemplateId" if pool.ec2.launch_template.startswith("lt-") else "LaunchTemplateName"
        )
        request: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "LaunchTemplate": {template_key: pool.ec2.launch_template, "Version": pool.ec2.version},
            "TagSpecifications": [
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": POOL_TAG, "Value": pool.name},
                        {"Key": BURST_TAG, "Value": burst_worker_id},
                        {"Key": "Name", "Value": f"hypermedia-{pool.name}-{burst_worker_id[:8]}"},
                    ],
                }
            ],
            "ClientToken": burst_worker_id,  # a retried launch of the same burst worker is one instance
        }
        if pool.ec2.instance_type:
            request["InstanceType"] = pool.ec2.instance_type
        if pool.ec2.subnet_id:
            request["SubnetId"] = pool.ec2.subnet_id
        if pool.capacity_type == "spot":
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        reply = await asyncio.to_thread(lambda: self._ec2.run_instances(**request))
        return str(reply["Instances"][0]["InstanceId"])

    async def list(self, pool: Pool) -> list[Instance]:
        """The pool's instances that are not terminated, by their tags."""
        filters = [
            {"Name": f"tag:{POOL_TAG}", "Values": [pool.name]},
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "stopping", "stopped", "shutting-down"],
            },
        ]
        pages = await asyncio.to_thread(
            lambda: list(self._ec2.get_paginator("describe_instances").paginate(Filters=filters))
        )
        return [_instance(i) for page in pages for r in page["Reservations"] for i in r["Instances"]]

    async def describe(self, provider_ref: str) -> Instance | None:
        try:
            reply = await asyncio.to_thread(lambda: self._ec2.describe_instances(InstanceIds=[provider_ref]))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
                return None
            raise
        found = [i for r in reply["Reservations"] for i in r["Instances"]]
        return _instance(found[0]) if found else None

    async def terminate(self, provider_ref: str) -> None:
        """``terminate_instances``; an instance already gone is not an error."""
        try:
            await asyncio.to_thread(lambda: self._ec2.terminate_instances(InstanceIds=[provider_ref]))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                raise

    async def close(self) -> None:
        """Nothing: instances outlive a scheduler restart, the next leader adopts them."""


def _instance(raw: dict[str, Any]) -> Instance:
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
    state = raw["State"]["Name"]
    return Instance(
        tags.get(BURST_TAG, ""),
        raw["InstanceId"],
        "running" if state in RUNNING_STATES else "stopped",
        f"instance {state}" + (" (spot)" if raw.get("InstanceLifecycle") == "spot" else ""),
    )
