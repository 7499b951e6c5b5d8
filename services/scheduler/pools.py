"""A pool of burst workers (issue 20): which queues its workers take, where they run, what one
costs, and the bounds the scheduler keeps it in. Read from ``HM_SCHEDULER_POOLS`` (a JSON list, or
``@path`` to a JSON file); see docs/operations.md ("Scheduler")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from hypermedia.core.config import LaneName

ProviderName = Literal["local", "ec2", "kubernetes"]
"""Providers of this release (services/scheduler/providers/, docs/operations.md)."""
CapacityType = Literal["on-demand", "spot"]


class Ec2Options(BaseModel):
    """How an ``ec2`` pool's instances are launched: from a launch template (AMI, instance type,
    network, IAM profile, and a boot script that starts the worker with the instance's
    ``hypermedia-burst-worker-id`` tag as ``HM_BURST_WORKER_ID``: docs/operations.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    launch_template: str = Field(min_length=1, max_length=128)
    """The launch template's name, or its id (``lt-…``)."""
    version: str = Field("$Default", pattern=r"^(\$Default|\$Latest|[0-9]{1,10})$")
    instance_type: str | None = Field(None, pattern=r"^[a-z0-9]+[a-z0-9-]*\.[a-z0-9]+$")
    """Overrides the template's instance type."""
    subnet_id: str | None = Field(None, pattern=r"^subnet-[0-9a-f]+$")


SPOT_LABEL = "karpenter.sh/capacity-type"
"""The node label Karpenter puts on its nodes (``spot`` or ``on-demand``); EKS managed node groups
use ``eks.amazonaws.com/capacityType`` (``SPOT``), GKE ``cloud.google.com/gke-spot`` (``"true"``)."""


class KubernetesOptions(BaseModel):
    """How a ``kubernetes`` pool's pods are made: from a ``v1/PodTemplate`` in the namespace (the
    worker's pod spec as its Deployment has it: deploy/k8s/burst/), with the burst worker's name,
    labels, annotations and environment added, ``restartPolicy: Never`` (a burst worker is
    replaced, never restarted) and, for a spot pool, the spot node selector and tolerations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field("hypermedia", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    pod_template: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    """The PodTemplate's name (in ``namespace``)."""
    container: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """The worker's container in the template; default its first."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Added to the template's node selector, on-demand or spot."""
    spot_node_selector: dict[str, str] = Field(default_factory=lambda: {SPOT_LABEL: "spot"})
    """Added for a spot pool."""
    spot_tolerations: tuple[dict[str, str], ...] = (
        {"key": SPOT_LABEL, "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    )
    """Added for a spot pool: they tolerate the taint an operator puts on spot nodes so that only
    work meant for spot lands there (the default matches a NodePool tainted
    ``karpenter.sh/capacity-type=spot:NoSchedule``)."""


class Pool(BaseModel):
    """One pool. Times are seconds, money is whatever currency ``cost_per_hour`` is in (the
    provider's list price of one worker, e.g. USD per instance-hour)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")
    queues: tuple[LaneName, ...] = Field(min_length=1)
    """The routes its workers take: queues (``images``) and bulk lanes (``bulk.images``, ADR 0057)."""
    provider: ProviderName = "local"
    capacity_type: CapacityType = "on-demand"
    slots_per_worker: int = Field(4, ge=1, le=64)
    min_workers: int = Field(0, ge=0, le=1000)
    max_workers: int = Field(4, ge=0, le=1000)
    boot_seconds: float = Field(60.0, gt=0, le=3600)
    """How long from launch until a worker takes jobs (measured: a local process about 3 s, a
    Kubernetes pod on a warm node 10–30 s, an EC2 instance 60–120 s)."""
    cost_per_hour: float = Field(0.0, ge=0)
    utilisation: float = Field(0.8, gt=0, le=1)
    """The share of a worker's slots the formula plans to keep busy (headroom for bursts)."""
    drain_target_seconds: float = Field(300.0, gt=0)
    """How soon the backlog should be worked off: slots for the backlog = its work ÷ this."""
    step_max: int = Field(4, ge=1, le=100)
    """Most workers started, or drained, in one cycle."""
    idle_seconds: float | None = Field(None, gt=0)
    """An idle burst worker is drained after this long idle; default its boot time (per-second
    billing: a worker idle for a boot time costs what booting a new one would)."""
    boot_grace_seconds: float | None = Field(None, gt=0)
    """A burst worker is never stopped this soon after launch, and one that has not registered
    by then is a failed boot; default three boot times."""
    max_spend_per_hour: float | None = Field(None, ge=0)
    """The pool's spend cap: the summed ``cost_per_hour`` of its live burst workers never goes
    above it (no cap when unset)."""
    default_job_seconds: float = Field(1.0, gt=0)
    """The expected work of a job of an operation that has no completed attempts yet."""
    ec2: Ec2Options | None = None
    """Required for (and only for) an ``ec2`` pool."""
    kubernetes: KubernetesOptions | None = None
    """Required for (and only for) a ``kubernetes`` pool."""

    @model_validator(mode="after")
    def _bounds(self) -> Pool:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        if len(set(self.queues)) != len(self.queues):
            raise ValueError("a queue is named twice")
        if (self.provider == "ec2") != (self.ec2 is not None):
            raise ValueError(
                "an ec2 pool needs the ec2 field (its launch template), and only an ec2 pool has one"
            )
        if (self.provider == "kubernetes") != (self.kubernetes is not None):
            raise ValueError(
                "a kubernetes pool needs the kubernetes field (its pod template), and only a kubernetes "
                "pool has one"
            )
        return self

    @property
    def idle_after(self) -> float:
        return self.idle_seconds if self.idle_seconds is not None else self.boot_seconds

    @property
    def boot_grace(self) -> float:
        return self.boot_grace_seconds if self.boot_grace_seconds is not None else 3 * self.boot_seconds


POOLS = TypeAdapter(tuple[Pool, ...])


def parse_pools(text: str) -> tuple[Pool, ...]:
    """The pools of ``HM_SCHEDULER_POOLS``: JSON, or ``@path`` of a JSON file. Raises ValueError
    (pydantic's, naming each bad field) or OSError (the file)."""
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as file:
            text = file.read()
    pools = POOLS.validate_json(text or "[]")
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):
        raise ValueError("two pools have the same name")
    return pools
