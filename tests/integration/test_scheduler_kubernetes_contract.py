"""Contract tests of the scheduler's ``kubernetes`` provider (services/scheduler/providers/
kubernetes.py) against a local server that plays the Kubernetes API server (tests/helpers/
kube_api.py; no cluster can run here), reached through the official client with a kubeconfig and
a bearer token, as the scheduler reaches a cluster: a spot pod built from the shipped PodTemplate
(deploy/k8s/burst/), found by its pool's label, deleted gracefully; then whole scheduler cycles on
real Postgres launching, adopting, draining and deleting pods, and a pod evicted under a worker.

Opt-in run against a real cluster: set ``HM_TEST_KUBECONFIG`` (and ``HM_TEST_KUBE_NAMESPACE``, an
existing namespace the kubeconfig may create pods and pod templates in; default
``hypermedia-test``). The same scenarios then create real pods (they stay Pending without the
images and spot nodes: the scenarios need no more) and delete them; what only a kubelet does (a
phase, an eviction) is played on the fake alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from kubernetes.aio import client

from services.scheduler.pools import SPOT_LABEL, KubernetesOptions, Pool
from services.scheduler.providers.kubernetes import (
    BURST_LABEL,
    NO_DISRUPTION,
    POOL_LABEL,
    KubernetesProvider,
    open_client,
)
from services.scheduler.scheduler import Scheduler
from tests.helpers.kube_api import FakeKubeApi
from tests.integration.conftest import Seeder

REAL_KUBECONFIG = os.environ.get("HM_TEST_KUBECONFIG", "")
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy/k8s/burst/podtemplate-imageworker.yaml"


@dataclass
class Cluster:
    namespace: str
    template: str
    fake: FakeKubeApi | None
    kubeconfig: Path

    async def provider(self) -> KubernetesProvider:
        return KubernetesProvider(await open_client(str(self.kubeconfig)))

    async def pods(self, pool: str) -> list[Any]:
        """The pool's pods as the API lists them (a client of its own)."""
        api = await open_client(str(self.kubeconfig))
        try:
            reply = await client.CoreV1Api(api).list_namespaced_pod(
                self.namespace, label_selector=f"{POOL_LABEL}={pool}"
            )
            return list(reply.items)
        finally:
            await api.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """The fake API server with the shipped PodTemplate, or a real cluster (opt-in)."""
    manifest = yaml.safe_load(TEMPLATE.read_text())
    name = f"imageworker-burst-{uuid.uuid4().hex[:6]}"
    manifest["metadata"] |= {"name": name}
    fake = None if REAL_KUBECONFIG else FakeKubeApi()
    if fake is not None:
        fake.__enter__()
        kubeconfig, namespace = fake.kubeconfig(tmp_path / "kubeconfig"), "hypermedia"
    else:
        kubeconfig = Path(REAL_KUBECONFIG)
        namespace = os.environ.get("HM_TEST_KUBE_NAMESPACE", "hypermedia-test")
    manifest["metadata"]["namespace"] = namespace
    api = await open_client(str(kubeconfig))
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod_template(namespace, manifest)
    try:
        yield Cluster(namespace, name, fake, kubeconfig)
    finally:
        for pod in (await core.list_namespaced_pod(namespace, label_selector=BURST_LABEL)).items:
            if pod.metadata.name.startswith("hm-"):
                await core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        await core.delete_namespaced_pod_template(name, namespace)
        await api.close()
        if fake is not None:
            fake.__exit__(None, None, None)


def spot_pool(cluster: Cluster, name: str = "images-spot", **fields: Any) -> Pool:
    options = KubernetesOptions(
        namespace=cluster.namespace,
        pod_template=cluster.template,
        node_selector={"hypermedia.io/role": "burst"},
    )
    defaults: dict[str, Any] = {
        "slots_per_worker": 4,
        "max_workers": 3,
        "boot_seconds": 20,
        "cost_per_hour": 0.05,
    }
    return Pool(
        name=f"{name}-{uuid.uuid4().hex[:4]}",
        queues=("images",),
        provider="kubernetes",
        capacity_type="spot",
        kubernetes=options,
        **(defaults | fields),
    )


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


async def test_a_spot_pod_is_built_from_the_template_found_by_its_pool_and_deleted(cluster: Cluster) -> None:
    provider = await cluster.provider()
    pool = spot_pool(cluster, slots_per_worker=6)
    burst_id = str(uuid.uuid4())
    try:
        ref = await provider.launch(pool, burst_id)
        assert ref == f"{cluster.namespace}/hm-{pool.name}-{burst_id}"
        assert await provider.launch(pool, burst_id) == ref, "a retried launch finds its pod"
        [pod] = await cluster.pods(pool.name)
        assert pod.metadata.labels[POOL_LABEL] == pool.name and pod.metadata.labels[BURST_LABEL] == burst_id
        assert pod.metadata.labels["app.kubernetes.io/name"] == "imageworker", "the template's labels stay"
        assert {k: pod.metadata.annotations[k] for k in NO_DISRUPTION} == NO_DISRUPTION
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.node_selector == {SPOT_LABEL: "spot", "hypermedia.io/role": "burst"}
        assert [(t.key, t.value, t.effect) for t in pod.spec.tolerations or [] if t.key == SPOT_LABEL] == [
            (SPOT_LABEL, "spot", "NoSchedule")
        ]
        env = env_of(pod)
        assert (env["HM_BURST_WORKER_ID"], env["HM_WORKER_QUEUE"], env["HM_WORKER_SLOTS"]) == (
            burst_id,
            "images",
            "6",
        )
        names = [e.name for e in pod.spec.containers[0].env]
        assert len(names) == len(set(names)), "the template's HM_WORKER_SLOTS is replaced, not repeated"
        assert env["HM_SANDBOX_REQUIRE"] == "full" and pod.spec.host_users is False, "the sandbox layers stay"
        assert pod.spec.security_context.seccomp_profile.localhost_profile == "hypermedia-worker.json"
        assert pod.spec.termination_grace_period_seconds == 60
        if cluster.fake is not None:
            assert all(r.authorization == f"Bearer {cluster.fake.token}" for r in cluster.fake.requests)

        [listed] = await provider.list(pool)
        assert (listed.burst_worker_id, listed.provider_ref, listed.state) == (burst_id, ref, "running")
        assert await provider.list(spot_pool(cluster, name="other")) == []
        await provider.terminate(ref)
        await provider.terminate(ref)  # twice: not an error
        described = await provider.describe(ref)
        assert described is None or (described.state == "stopped" and "deleted" in described.detail)
        if cluster.fake is not None:
            assert cluster.fake.finish_deletions() == 1
        assert await provider.describe(ref) is None or cluster.fake is None
        assert await provider.describe(f"{cluster.namespace}/hm-nothing") is None
    finally:
        await provider.close()


@pytest.mark.parametrize("broken", ["container", "template"])
async def test_a_launch_the_cluster_cannot_make_fails_its_burst_worker_in_one_line(
    cluster: Cluster, fresh_pool: asyncpg.Pool, seed: Seeder, broken: str
) -> None:
    provider = await cluster.provider()
    if broken == "container":
        options = KubernetesOptions(
            namespace=cluster.namespace, pod_template=cluster.template, container="worker"
        )
        want = (
            f"launch failed: ValueError: pod template {cluster.template!r} has not a container named 'worker'"
        )
    else:
        options = KubernetesOptions(namespace=cluster.namespace, pod_template="no-such-template")
        want = (
            f"launch failed: KubernetesError: reading pod template {cluster.namespace}/no-such-template: "
            '404 NotFound: podtemplates "no-such-template" not found'
        )
    pool = spot_pool(cluster).model_copy(update={"kubernetes": options})
    tenant = await seed.tenant()
    for _ in range(50):
        await seed.job(tenant)
    try:
        async with fresh_pool.acquire() as conn:
            [plan] = await Scheduler([pool], {"kubernetes": provider}, "host/1").run_once(conn)
            assert plan.action == "start"
            rows = await conn.fetch("SELECT state, reason FROM burst_workers")
        assert {(r["state"], r["reason"]) for r in rows} == {("failed", want)}
        assert await cluster.pods(pool.name) == []
    finally:
        await provider.close()


async def test_scheduler_cycles_launch_adopt_drain_and_delete_pods(
    cluster: Cluster, fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    pool = spot_pool(cluster, idle_seconds=30)
    tenant = await seed.tenant()
    for _ in range(400):
        await seed.job(tenant)
    first_provider, second_provider = await cluster.provider(), await cluster.provider()
    try:
        leader = Scheduler([pool], {"kubernetes": first_provider}, "host/1")
        async with fresh_pool.acquire() as conn:
            [first] = await leader.run_once(conn)
            # 400 jobs × 1 s over the 300 s drain target plus 400 arrivals over 120 s: 4.67 slots
            # → ceil(4.67 / 3.2) = 2 workers.
            assert (first.target, first.action, first.count) == (2, "start", 2)
            rows = await conn.fetch(
                "SELECT burst_worker_id::text AS id, state, provider_ref FROM burst_workers"
            )
            assert {r["state"] for r in rows} == {"booting"}
            pods = await cluster.pods(pool.name)
            assert {
                p.metadata.labels[BURST_LABEL]: f"{cluster.namespace}/{p.metadata.name}" for p in pods
            } == {r["id"]: r["provider_ref"] for r in rows}

            # A new leader (a new client): the booting pods count, nothing is created twice.
            successor = Scheduler([pool], {"kubernetes": second_provider}, "host/2")
            [again] = await successor.run_once(conn)
            assert (again.action, again.count) == ("hold", 0), again.reason
            assert len(await cluster.pods(pool.name)) == 2

            # The pods' workers register (as the image's worker would with HM_BURST_WORKER_ID).
            for i, row in enumerate(rows):
                await conn.execute(
                    "INSERT INTO workers (worker_id, deployment, boot_id, role, generation, queue, slots, hostname, "
                    "pid, status, burst_worker_id) VALUES ($1, 'prod', 'b', 'imageworker', 0, 'images', 4, $2, 1, "
                    "'running', $3::uuid)",
                    f"prod/imageworker/pod-{i}/b/g0/1",
                    row["provider_ref"].split("/")[1][:63],
                    row["id"],
                )
            if cluster.fake is not None:
                for row in rows:
                    cluster.fake.kubelet(cluster.namespace, row["provider_ref"].split("/")[1], "Running")
            await successor.run_once(conn)
            assert {r["state"] for r in await conn.fetch("SELECT state FROM burst_workers")} == {"registered"}

            # The queue is empty and both idle past their boot grace: drained, not yet deleted.
            await conn.execute("DELETE FROM processing_jobs")
            await conn.execute(
                "UPDATE burst_workers SET requested_at = now() - interval '1 hour', "
                "last_busy_at = now() - interval '5 minutes'"
            )
            [drained] = await successor.run_once(conn)
            assert (drained.target, drained.action, drained.count) == (0, "drain", 2)
            assert {r["status"] for r in await conn.fetch("SELECT status FROM workers")} == {"draining"}
            assert [p.metadata.deletion_timestamp for p in await cluster.pods(pool.name)] == [None, None]

            # The workers drained and stopped: only now are the pods deleted.
            await conn.execute("UPDATE workers SET status = 'stopped'")
            await successor.run_once(conn)
            ended = await conn.fetch("SELECT state, reason, terminated_at FROM burst_workers")
            assert {(r["state"], r["reason"]) for r in ended} == {("terminated", "its worker stopped")}
        left = await cluster.pods(pool.name)
        assert all(p.metadata.deletion_timestamp is not None for p in left), "deleted (gracefully)"
    finally:
        await first_provider.close()
        await second_provider.close()


@pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="an eviction is a kubelet's act: played on the fake alone")
async def test_an_evicted_pod_ends_its_burst_worker_and_is_replaced(
    cluster: Cluster, fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    assert cluster.fake is not None
    pool = spot_pool(cluster, boot_seconds=5)
    tenant = await seed.tenant()
    for _ in range(100):
        await seed.job(tenant)
    provider = await cluster.provider()
    try:
        scheduler = Scheduler([pool], {"kubernetes": provider}, "host/1")
        async with fresh_pool.acquire() as conn:
            [first] = await scheduler.run_once(conn)
            assert (first.action, first.count) == ("start", 1)
            [row] = await conn.fetch("SELECT burst_worker_id::text AS id, provider_ref FROM burst_workers")
            name = row["provider_ref"].split("/")[1]
            await conn.execute(
                "INSERT INTO workers (worker_id, deployment, boot_id, role, generation, queue, slots, hostname, pid, "
                "status, burst_worker_id) VALUES ('prod/imageworker/pod/b/g0/1', 'prod', 'b', 'imageworker', 0, "
                "'images', 4, 'pod', 1, 'running', $1::uuid)",
                row["id"],
            )
            cluster.fake.kubelet(cluster.namespace, name, "Running")
            await scheduler.run_once(conn)
            # The spot node is reclaimed: the kubelet evicts the pod; its worker never says stopped.
            cluster.fake.kubelet(cluster.namespace, name, "Failed", reason="Evicted", exit_code=137)
            [instance] = await provider.list(pool)
            assert instance.state == "stopped"
            assert instance.detail == "pod Failed (Evicted); imageworker exited 137 (Error)"
            [replaced] = await scheduler.run_once(conn)
            ended = await conn.fetchrow(
                "SELECT state, reason FROM burst_workers WHERE burst_worker_id = $1::uuid", row["id"]
            )
            assert (ended["state"], ended["reason"]) == (
                "terminated",
                "lost: pod Failed (Evicted); imageworker exited 137 (Error) (worker running)",
            )
            assert (replaced.action, replaced.count) == ("start", 1), replaced.reason
            assert (
                len([p for p in await cluster.pods(pool.name) if p.metadata.deletion_timestamp is None]) == 1
            )
    finally:
        await provider.close()
