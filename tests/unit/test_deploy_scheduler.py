"""The scheduler's deployment files agree with its code: the burst overlay's pool is one the
scheduler accepts, the pod it makes from the shipped PodTemplate is a valid Pod of the oldest and
newest Kubernetes the manifests support, and deploy/check_policy.py refuses a ScaledObject back on
JetStream's lag and a service-account token in any workload but the scheduler."""

from __future__ import annotations

import importlib.util
import shutil
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.scheduler.pools import parse_pools
from services.scheduler.providers.kubernetes import BURST_LABEL, build_pod

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def policy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_policy", DEPLOY / "check_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def burst_pool_json() -> str:
    kustomization = yaml.safe_load((DEPLOY / "k8s/burst/kustomization.yaml").read_text())
    [patch] = kustomization["patches"]
    [container] = yaml.safe_load(patch["patch"])["spec"]["template"]["spec"]["containers"]
    return str(next(e["value"] for e in container["env"] if e["name"] == "HM_SCHEDULER_POOLS"))


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_burst_pool_makes_valid_pods_from_the_shipped_template(version: str) -> None:
    [pool] = parse_pools(burst_pool_json())
    assert pool.provider == "kubernetes" and pool.kubernetes is not None
    template = yaml.safe_load((DEPLOY / "k8s/burst/podtemplate-imageworker.yaml").read_text())
    assert template["metadata"]["name"] == pool.kubernetes.pod_template
    burst_id = str(uuid.uuid4())
    pod = build_pod(pool, burst_id, template)
    kubernetes_validate.validate(pod, version, strict=True)
    assert pod["metadata"]["labels"][BURST_LABEL] == burst_id
    assert pod["spec"]["nodeSelector"] == {"karpenter.sh/capacity-type": "spot"}
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env["HM_WORKER_QUEUE"], env["HM_WORKER_SLOTS"], env["HM_BURST_WORKER_ID"]) == (
        "images",
        "4",
        burst_id,
    )


def test_the_shipped_deploy_directory_keeps_the_policy() -> None:
    assert policy().main(["check_policy", str(DEPLOY)]) == 0


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    return copy


def _edit(path: Path, change: Any) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    change(docs)
    path.write_text(yaml.safe_dump_all(docs))


def test_a_scaled_object_on_jetstream_lag_is_refused(tmp_path: Path) -> None:
    copy = _copy(tmp_path)

    def back_to_lag(docs: list[Any]) -> None:
        docs[0]["spec"]["triggers"] = [
            {"type": "nats-jetstream", "metadata": {"stream": "HM_IMAGES", "consumer": "images-p1"}}
        ]

    _edit(copy / "k8s/keda/scaledobject-imageworker.yaml", back_to_lag)
    problems = policy().check_k8s(copy / "k8s")
    assert problems == [
        "scaledobject-imageworker.yaml: ScaledObject/imageworker: needs exactly one trigger, of type "
        "external (the scheduler's scaler)"
    ]


def test_a_scaled_object_with_other_slots_than_its_worker_is_refused(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _edit(
        copy / "k8s/keda/scaledobject-docworker.yaml",
        lambda docs: docs[0]["spec"]["triggers"][0]["metadata"].update(slotsPerReplica="4"),
    )
    assert policy().check_k8s(copy / "k8s") == [
        "scaledobject-docworker.yaml: ScaledObject/docworker: trigger metadata slotsPerReplica '4', not '2'"
    ]


def test_only_the_scheduler_may_mount_a_service_account_token(tmp_path: Path) -> None:
    copy = _copy(tmp_path)

    def token(docs: list[Any]) -> None:
        docs[0]["spec"]["template"]["spec"]["volumes"].append(
            {"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
        )

    _edit(copy / "k8s/reaper.yaml", token)
    assert policy().check_k8s(copy / "k8s") == [
        "reaper.yaml: Deployment/reaper: volume api mounts a service-account token (only ['scheduler'])"
    ]


def test_the_ingress_policies_admit_exactly_the_callers_the_code_allows(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    policies = copy / "k8s/networkpolicy-ingress.yaml"
    assert policy().check_ingress(copy / "k8s") == []

    def without_reaper(docs: list[Any]) -> None:
        [credits] = [d for d in docs if d["metadata"]["name"] == "credits-ingress"]
        credits["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"].remove(
            "reaper"
        )

    _edit(policies, without_reaper)
    assert policy().check_ingress(copy / "k8s") == [
        "credits ingress: :50061 admits ['docworker', 'gateway', 'imageworker', 'mediaworker', 'ocrworker'],"
        " the code's callers are ['docworker', 'gateway', 'imageworker', 'mediaworker', 'ocrworker', 'reaper']"
    ]


def test_an_internal_port_open_to_any_pod_or_a_pod_left_open_is_refused(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    policies = copy / "k8s/networkpolicy-ingress.yaml"

    def storage_open(docs: list[Any]) -> None:
        [storage] = [d for d in docs if d["metadata"]["name"] == "storage-ingress"]
        del storage["spec"]["ingress"][0]["from"]

    _edit(policies, storage_open)
    assert "storage ingress: :50062 is open to any pod, not only its callers" in policy().check_ingress(
        copy / "k8s"
    )
    _edit(policies, lambda docs: docs.pop(0))  # metrics-ingress: the workers and the reaper unselected
    problems = policy().check_ingress(copy / "k8s")
    assert "reaper.yaml: Deployment/reaper: no ingress NetworkPolicy selects its pods" in problems
    assert (
        "gateway.yaml: Deployment/gateway: no ingress rule lets a monitoring namespace scrape :9464"
        in problems
    )
