"""The ``kubernetes`` provider: one Pod per burst worker (as Actions Runner Controller makes one
Pod per runner), through the official client's asyncio API (``kubernetes.aio``).

The pod is the pool's ``v1/PodTemplate`` (:class:`~services.scheduler.pools.KubernetesOptions`)
named ``hm-{pool}-{burst worker id}``, labelled :data:`POOL_LABEL` and :data:`BURST_LABEL` (how
:meth:`KubernetesProvider.list` finds a pool's pods after a leader change), annotated so that
neither Karpenter nor the cluster autoscaler moves it (:data:`NO_DISRUPTION`: a burst worker is
stopped only by the scheduler, after its drain), with ``HM_BURST_WORKER_ID`` and the pool's queues
and slots in the worker container's environment and ``restartPolicy: Never``. A spot pool adds its
spot node selector and tolerations. Termination is the pod's deletion with the template's grace
period: the kubelet's SIGTERM finds a worker that has drained already.

A provider reference is ``{namespace}/{pod name}``. A refused launch raises :class:`KubernetesError`
(one line, which the scheduler records on the burst worker); the other calls raise the client's
``ApiException``. Tested against a local server that plays the API
server (tests/helpers/kube_api.py, tests/integration/test_scheduler_kubernetes_contract.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any, cast

from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.config import ConfigException

__all__ = ["ConfigException", "KubernetesError", "KubernetesProvider", "build_pod", "open_client", "pod_name"]

from services.scheduler.pools import Pool
from services.scheduler.providers import Instance

POOL_LABEL = "hypermedia.io/pool"
BURST_LABEL = "hypermedia.io/burst-worker-id"
NO_DISRUPTION = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
}
"""Annotations that keep Karpenter's consolidation and the cluster autoscaler's scale-down from
evicting the pod (karpenter.sh docs "Disruption"; the autoscaler's FAQ)."""
OWN_ENV = ("HM_BURST_WORKER_ID", "HM_WORKER_QUEUE", "HM_WORKER_QUEUES", "HM_WORKER_SLOTS")
"""Variables the provider sets in the worker container, replacing the template's."""


async def open_client(kubeconfig: str = "", context: str = "") -> client.ApiClient:
    """The API client: from the kubeconfig file ``kubeconfig`` (its ``context``, default its
    current one), or, when ``kubeconfig`` is empty, the pod's service account (in-cluster).
    Raises ``kubernetes.aio.config.ConfigException`` when neither can be loaded."""
    if kubeconfig:
        return await config.new_client_from_config(kubeconfig, context or None, persist_config=False)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def pod_name(pool: Pool, burst_worker_id: str) -> str:
    """``hm-{pool}-{id}``: at most 80 characters, a valid DNS subdomain (253)."""
    return f"hm-{pool.name}-{burst_worker_id}"


def build_pod(pool: Pool, burst_worker_id: str, template: dict[str, Any]) -> dict[str, Any]:
    """The Pod of one burst worker from ``template`` (a ``v1/PodTemplate`` as JSON). Raises
    ValueError when the template has no containers or not the one the pool names."""
    options = pool.kubernetes
    assert options is not None, "a kubernetes pool has its kubernetes options (Pool validates it)"
    inner = copy.deepcopy(template.get("template") or {})
    meta, spec = inner.get("metadata") or {}, inner.get("spec") or {}
    containers = spec.get("containers") or []
    chosen = [c for c in containers if options.container in (None, c.get("name"))][:1]
    if not chosen:
        want = f"a container named {options.container!r}" if options.container else "any container"
        raise ValueError(f"pod template {options.pod_template!r} has not {want}")
    if len(pool.queues) == 1:
        own = {"HM_WORKER_QUEUE": pool.queues[0], "HM_WORKER_SLOTS": str(pool.slots_per_worker)}
    else:  # the template runs services.multiworker
        own = {"HM_WORKER_QUEUES": ",".join(f"{q}={pool.slots_per_worker}" for q in pool.queues)}
    own["HM_BURST_WORKER_ID"] = burst_worker_id
    env = [e for e in chosen[0].get("env") or [] if e.get("name") not in OWN_ENV]
    chosen[0]["env"] = env + [{"name": k, "value": v} for k, v in sorted(own.items())]
    node_selector = dict(spec.get("nodeSelector") or {}) | options.node_selector
    tolerations = list(spec.get("tolerations") or [])
    if pool.capacity_type == "spot":
        node_selector |= options.spot_node_selector
        tolerations += [dict(t) for t in options.spot_tolerations]
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    spec["restartPolicy"] = "Never"
    labels = dict(meta.get("labels") or {}) | {
        POOL_LABEL: pool.name,
        BURST_LABEL: burst_worker_id,
        "app.kubernetes.io/managed-by": "hypermedia-scheduler",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(pool, burst_worker_id),
            "namespace": options.namespace,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}) | NO_DISRUPTION,
        },
        "spec": spec,
    }


class KubernetesError(RuntimeError):
    """A call the API server refused, in one line: what was asked, the HTTP status, the
    ``Status`` reason and message (e.g. ``creating pod hm-…: 403 Forbidden: pods is forbidden:
    …``), which the scheduler records on the burst worker."""

    @classmethod
    def of(cls, exc: ApiException, doing: str) -> KubernetesError:
        reason, message = exc.reason or "", ""
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            status = json.loads(exc.body or "")
            reason, message = status.get("reason") or reason, status.get("message") or ""
        return cls(f"{doing}: {exc.status} {reason}" + (f": {message}" if message else ""))


class KubernetesProvider:
    """Burst workers as pods, through ``api`` (a ``kubernetes.aio.client.ApiClient``, which this
    provider closes)."""

    name = "kubernetes"

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)

    async def launch(self, pool: Pool, burst_worker_id: str) -> str:
        """Creates the pod (see the module docstring); returns ``{namespace}/{name}``. A launch
        retried for the same burst worker finds its pod (409 AlreadyExists) and returns it."""
        options = pool.kubernetes
        assert options is not None
        try:
            template = await self._core.read_namespaced_pod_template(options.pod_template, options.namespace)
        except ApiException as exc:
            raise KubernetesError.of(
                exc, f"reading pod template {options.namespace}/{options.pod_template}"
            ) from exc
        pod = build_pod(pool, burst_worker_id, self._api.sanitize_for_serialization(template))
        try:
            # The client sends a dict body as it is (ApiClient.sanitize_for_serialization).
            await self._core.create_namespaced_pod(options.namespace, cast("client.V1Pod", pod))
        except ApiException as exc:
            if exc.status != 409:
                raise KubernetesError.of(exc, f"creating pod {pod['metadata']['name']}") from exc
        return f"{options.namespace}/{pod['metadata']['name']}"

    async def list(self, pool: Pool) -> list[Instance]:
        """The pool's pods, by label (terminating ones as ``stopped``)."""
        assert pool.kubernetes is not None
        pods = await self._core.list_namespaced_pod(
            pool.kubernetes.namespace, label_selector=f"{POOL_LABEL}={pool.name}"
        )
        return [_instance(pod) for pod in pods.items]

    async def describe(self, provider_ref: str) -> Instance | None:
        namespace, _, name = provider_ref.partition("/")
        try:
            return _instance(await self._core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def terminate(self, provider_ref: str) -> None:
        """Deletes the pod (its template's grace period); one already gone is not an error."""
        namespace, _, name = provider_ref.partition("/")
        try:
            await self._core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def close(self) -> None:
        """Closes the client; pods outlive a scheduler restart, the next leader adopts them."""
        await self._api.close()


def _instance(pod: Any) -> Instance:
    """Pending or Running and not being deleted: ``running``; else ``stopped``, with why (the
    pod's reason, e.g. Evicted, and the worker container's exit)."""
    meta, status = pod.metadata, pod.status
    phase = (status.phase if status is not None else None) or "Pending"
    ref = f"{meta.namespace}/{meta.name}"
    burst_id = (meta.labels or {}).get(BURST_LABEL, "")
    if meta.deletion_timestamp is None and phase in ("Pending", "Running"):
        return Instance(burst_id, ref, "running", f"pod {phase}")
    detail = "pod deleted" if meta.deletion_timestamp is not None else f"pod {phase}"
    if status is not None and status.reason:
        detail += f" ({status.reason})"
    for container in (status.container_statuses or []) if status is not None else []:
        ended = container.state.terminated if container.state is not None else None
        if ended is not None:
            detail += f"; {container.name} exited {ended.exit_code}" + (
                f" ({ended.reason})" if ended.reason else ""
            )
    return Instance(burst_id, ref, "stopped", detail)
