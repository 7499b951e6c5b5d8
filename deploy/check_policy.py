"""Policy checks of deploy/ that the schema linters cannot make (run by deploy/lint.sh).

hadolint, ``docker compose config`` and kubernetes-validate say whether each file is well formed;
this says whether the files keep the platform's rules and agree with each other:

- every workload runs non-root with a read-only root filesystem, no privilege escalation, all
  capabilities dropped, RuntimeDefault seccomp, no service-account token, and CPU/memory requests
  and limits; every container that listens has readiness and liveness probes;
- workers get a writable /work, a grace period longer than their 35 s drain and control's 10 s,
  and an ``HM_UNIT_MEMORY_MB`` that leaves control its 320 MiB under the container's limit;
- Services select existing pods and name existing container ports; kustomizations list every
  manifest beside them; ScaledObjects target a worker with one ``external`` trigger on the
  scheduler's scaler, with the worker's queue and slots; only the scheduler mounts a
  service-account token; PodTemplates (burst/) are checked as the workloads are;
- Secrets exist only as ``*.example.yaml`` with placeholders; ConfigMaps hold no secret;
- every hypermedia service in compose.yaml is read-only, capability-free, has tmpfs /tmp and /work
  and resource limits; every image name maps to a target of deploy/docker/Dockerfile, which runs
  ``python -m services.<target>`` and whose HEALTHCHECK is one ``docker/healthcheck.py`` knows;
- every worker target of the Dockerfile (one that sets ``HM_WORKER_QUEUE``) is deployed everywhere,
  alike: a Deployment of the same name in k8s/ and a compose service with the target's queue and
  slots, memory request equal to its limit, an egress NetworkPolicy selecting its pods, a
  ScaledObject in k8s/keda/ and the keda overlay's patch that removes its fixed replica count;
  its status port (the image's ``HM_WORKER_STATUS_BIND``) is the one ``healthcheck.py`` probes by
  default and, in the Deployment, the bind, a container port and every gRPC probe's port;
- only the targets of ``APT_PACKAGES`` install Debian packages, each exactly its Makefile list (what
  ``make test`` installs on a developer's machine): the docworker ``DOCWORKER_PACKAGES``
  (LibreOffice, python3-uno, the office fonts and those of the other scripts; it also sets
  ``HM_OFFICE_PYTHON``), the ocrworker
  ``OCR_PACKAGES`` (tesseract, its orientation model and languages).

Usage: ``python deploy/check_policy.py [DEPLOY_DIR]``; prints one line per problem, exits 1 on any.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

SERVICES = (
    "gateway",
    "credits",
    "storage",
    "imageworker",
    "docworker",
    "ocrworker",
    "mediaworker",
    "reaper",
    "scheduler",
)
"""Services that have an image today; each is a target of deploy/docker/Dockerfile, and every target
but ``SHARED_STAGES`` is one of them (so a new target cannot escape the checks below)."""
SHARED_STAGES = {"build", "runtime"}
"""Stages of deploy/docker/Dockerfile that the service targets build on; no image of their own."""
APT_PACKAGES = {"docworker": "DOCWORKER_PACKAGES", "ocrworker": "OCR_PACKAGES"}
"""Dockerfile targets that install Debian packages, and the Makefile variable each one's list must
equal (versions aside); every other target installs none."""
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "PodTemplate"}
"""Kinds that hold a pod template (a ``PodTemplate``: the scheduler's burst worker pods, burst/)."""
TOKEN_HOLDERS = {"scheduler"}
"""Workloads that may mount a service-account token (a projected ``serviceAccountToken``): the
scheduler's kubernetes provider calls the API server; no other workload does."""
SCALER_ADDRESS = "scheduler.hypermedia.svc.cluster.local:50081"
"""Where the ScaledObjects' ``external`` triggers reach the scheduler's External Scaler API."""
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|TOKEN|_KEY$|KEY_ID$|^HM_DATABASE_URL$)", re.IGNORECASE)
MIN_WORKER_GRACE_SECONDS = 50
"""Workers drain for 35 s after SIGTERM (HM_DRAIN_SECONDS) and their unit's control gives them 10 s
more before it kills what is left (ADR 0046); the kubelet must wait longer than both."""

CONTROL_RESERVE_MIB = 320
"""Memory a worker unit's control keeps for itself within the container's limit (seed 001)."""

Doc = dict[str, Any]


def load_manifests(k8s_dir: Path) -> Iterator[tuple[Path, Doc]]:
    for path in sorted(k8s_dir.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                yield path, doc


def _name(path: Path, doc: Doc) -> str:
    return f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def _template(doc: Doc) -> Doc:
    """The pod template of a workload: ``spec.template``, or a PodTemplate's ``template``."""
    return dict(doc["template"] if doc.get("kind") == "PodTemplate" else doc["spec"]["template"])


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in container.get("env", []) if "name" in e}


WORKER_SECCOMP = "hypermedia-worker.json"
"""The worker pods' Localhost seccomp profile: deploy/k8s/seccomp/hypermedia-worker.json."""
WORKER_APPARMOR = "hypermedia-worker"
"""The worker pods' Localhost AppArmor profile: deploy/k8s/apparmor/hypermedia-worker."""
SANDBOX_SYSCALLS = ("unshare", "clone", "clone3", "setns", "mount", "umount2", "landlock_restrict_self")
"""What the sandbox layers call and the runtime's default seccomp profile refuses without
CAP_SYS_ADMIN (issue 18); the worker profile must allow each."""


def _check_worker_layers(where: str, pod: Doc, pod_sc: Doc, sc: Doc, env: dict[str, str]) -> list[str]:
    """A worker container runs with what its sandbox layers need (docs/security.md "Layers"):
    ``HM_SANDBOX_REQUIRE=full``, a user-namespaced pod, the Localhost seccomp and AppArmor
    profiles of the workers."""
    problems = []
    if env.get("HM_SANDBOX_REQUIRE") != "full":
        problems.append(f"{where}: HM_SANDBOX_REQUIRE must be full")
    if pod.get("hostUsers") is not False:
        problems.append(f"{where}: hostUsers must be false (a user-namespaced pod)")
    for label, profile, want in (
        ("seccompProfile", sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}, WORKER_SECCOMP),
        (
            "appArmorProfile",
            sc.get("appArmorProfile") or pod_sc.get("appArmorProfile") or {},
            WORKER_APPARMOR,
        ),
    ):
        if profile.get("type") != "Localhost" or profile.get("localhostProfile") != want:
            problems.append(f"{where}: {label} must be Localhost {want}")
    return problems


def check_worker_seccomp(profile_path: Path) -> list[str]:
    """The worker seccomp profile refuses by default and allows what the layers call."""
    try:
        profile = json.loads(profile_path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{profile_path}: {exc}"]
    problems = []
    if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
        problems.append(f"{profile_path}: defaultAction must be SCMP_ACT_ERRNO")
    allowed = {
        name
        for rule in profile.get("syscalls", [])
        if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule.get("names", [])
    }
    for name in SANDBOX_SYSCALLS:
        if name not in allowed:
            problems.append(f"{profile_path}: {name} must be allowed unconditionally")
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "kexec_load"):
        if name in allowed:
            problems.append(f"{profile_path}: {name} must not be allowed")
    return problems


def check_workload(where: str, doc: Doc) -> list[str]:
    problems: list[str] = []
    pod = _template(doc)["spec"]
    pod_sc = pod.get("securityContext", {})
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: automountServiceAccountToken must be false")
    tokens = [
        v["name"]
        for v in pod.get("volumes", [])
        if any("serviceAccountToken" in source for source in v.get("projected", {}).get("sources", []))
    ]
    if tokens and doc["metadata"]["name"] not in TOKEN_HOLDERS:
        problems.append(
            f"{where}: volume {tokens[0]} mounts a service-account token (only {sorted(TOKEN_HOLDERS)})"
        )
    if pod_sc.get("runAsUser") == 0:
        problems.append(f"{where}: runAsUser 0")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for container in pod.get("initContainers", []) + pod["containers"]:
        cwhere = f"{where} container {container['name']}"
        sc = container.get("securityContext", {})
        image = container.get("image", "")
        if ":" not in image or image.endswith(":latest"):
            problems.append(f"{cwhere}: image {image!r} needs a pinned tag")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            problems.append(f"{cwhere}: runAsNonRoot must be true")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{cwhere}: readOnlyRootFilesystem must be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{cwhere}: allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problems.append(f"{cwhere}: capabilities must drop ALL")
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
        env = _env(container)
        if "HM_WORKER_QUEUE" in env:
            problems += _check_worker_layers(cwhere, pod, pod_sc, sc, env)
        elif seccomp.get("type") != "RuntimeDefault":
            problems.append(f"{cwhere}: seccompProfile must be RuntimeDefault")
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(section, {}):
                    problems.append(f"{cwhere}: resources.{section}.{resource} missing")
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        if "/tmp" not in mounts:
            problems.append(f"{cwhere}: no writable /tmp (the root filesystem is read-only)")
        if doc["kind"] != "Job" and container.get("ports"):
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in container:
                    problems.append(f"{cwhere}: {probe} missing")
        if "HM_WORKER_QUEUE" in env:
            grace = pod.get("terminationGracePeriodSeconds", 30)
            if grace < MIN_WORKER_GRACE_SECONDS:
                problems.append(
                    f"{cwhere}: terminationGracePeriodSeconds {grace} < {MIN_WORKER_GRACE_SECONDS}"
                )
            work_dir = env.get("HM_WORK_DIR", "")
            if "emptyDir" not in volumes.get(mounts.get(work_dir, ""), {}):
                problems.append(f"{cwhere}: HM_WORK_DIR {work_dir!r} is not an emptyDir mount")
            limit = _mib(str(resources.get("limits", {}).get("memory", "0")))
            unit_mb = str(env.get("HM_UNIT_MEMORY_MB", ""))
            if not unit_mb.isdigit() or not 0 < int(unit_mb) <= limit - CONTROL_RESERVE_MIB:
                problems.append(
                    f"{cwhere}: HM_UNIT_MEMORY_MB must leave control its {CONTROL_RESERVE_MIB} MiB under the "
                    f"container's memory limit ({limit} MiB)"
                )
    return problems


def _mib(quantity: str) -> int:
    """A Kubernetes memory quantity (``6Gi``, ``512Mi``) in MiB; 0 for another form."""
    units = {"Gi": 1024, "Mi": 1, "G": 1000**3 / 1024**2, "M": 1000**2 / 1024**2}
    for suffix, factor in units.items():
        if quantity.endswith(suffix) and quantity[: -len(suffix)].isdigit():
            return int(int(quantity[: -len(suffix)]) * factor)
    return 0


def check_services(docs: list[tuple[Path, Doc]]) -> list[str]:
    pods = [
        (_template(d)["metadata"].get("labels", {}), _template(d)["spec"])
        for _, d in docs
        if d.get("kind") in WORKLOAD_KINDS - {"Job", "PodTemplate"}
    ]
    problems = []
    for path, doc in docs:
        if doc.get("kind") != "Service":
            continue
        selector = doc["spec"].get("selector", {})
        matches = [spec for labels, spec in pods if selector.items() <= labels.items()]
        if not matches:
            problems.append(f"{_name(path, doc)}: selector {selector} matches no workload")
            continue
        port_names = {
            p.get("name") for spec in matches for c in spec["containers"] for p in c.get("ports", [])
        }
        for port in doc["spec"]["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str) and target not in port_names:
                problems.append(f"{_name(path, doc)}: targetPort {target!r} is no container port")
    return problems


def check_scaled_object(where: str, doc: Doc, workers: dict[str, tuple[str, str]]) -> list[str]:
    """One ``external`` trigger on the scheduler's External Scaler API (services/scheduler/keda.py)
    with the worker's queue and slots: KEDA then scales on Postgres's demand, running jobs
    included, not on JetStream's lag (about zero while jobs run)."""
    target = doc["spec"]["scaleTargetRef"]["name"]
    if target not in workers:
        return [f"{where}: scaleTargetRef {target!r} is no worker Deployment (with HM_WORKER_QUEUE)"]
    queue, slots = workers[target]
    triggers = doc["spec"].get("triggers", [])
    if [t.get("type") for t in triggers] != ["external"]:
        return [f"{where}: needs exactly one trigger, of type external (the scheduler's scaler)"]
    meta = triggers[0].get("metadata", {})
    problems = []
    for key, want in (("scalerAddress", SCALER_ADDRESS), ("queue", queue), ("slotsPerReplica", slots)):
        if str(meta.get(key)) != want:
            problems.append(f"{where}: trigger metadata {key} {meta.get(key)!r}, not {want!r}")
    return problems


def check_kustomizations(k8s_dir: Path) -> list[str]:
    problems = []
    for path in sorted(k8s_dir.rglob("kustomization.yaml")):
        listed = yaml.safe_load(path.read_text()).get("resources", [])
        for entry in listed:
            if not (path.parent / entry).exists():
                problems.append(f"{path}: resource {entry!r} does not exist")
        for manifest in sorted(path.parent.glob("*.yaml")):
            if manifest.name != "kustomization.yaml" and not manifest.name.endswith(".example.yaml"):
                if manifest.name not in listed:
                    problems.append(f"{path}: {manifest.name} is not listed in resources")
    return problems


def check_k8s(k8s_dir: Path) -> list[str]:
    docs = list(load_manifests(k8s_dir))
    problems = check_kustomizations(k8s_dir) + check_services(docs)
    workers = {
        d["metadata"]["name"]: (_env(c)["HM_WORKER_QUEUE"], _env(c).get("HM_WORKER_SLOTS", ""))
        for _, d in docs
        if d.get("kind") == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if "HM_WORKER_QUEUE" in _env(c)
    }
    for path, doc in docs:
        kind, where = doc.get("kind"), _name(path, doc)
        if kind in WORKLOAD_KINDS:
            problems += check_workload(where, doc)
            for c in _template(doc)["spec"]["containers"]:
                image = c.get("image", "").rsplit(":", 1)[0]
                if image.startswith("hypermedia/") and image.split("/", 1)[1] not in SERVICES:
                    problems.append(f"{where}: image {image} is no Dockerfile target")
        elif kind == "ScaledObject":
            problems += check_scaled_object(where, doc, workers)
        elif kind == "Secret":
            if not path.name.endswith(".example.yaml"):
                problems.append(f"{where}: Secrets are not committed; keep an *.example.yaml")
            for key, value in doc.get("stringData", {}).items():
                if "PLACEHOLDER" not in str(value):
                    problems.append(f"{where}: {key} is not a PLACEHOLDER value")
        elif kind == "ConfigMap":
            for key in doc.get("data", {}):
                if SECRET_NAME.search(key):
                    problems.append(f"{where}: {key} looks secret; put it in a Secret")
    return problems


def check_compose(compose_file: Path, dockerfile: Path) -> list[str]:
    targets = set(
        re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile.read_text(), re.MULTILINE | re.IGNORECASE)
    )
    problems = [f"{dockerfile}: no target {s}" for s in SERVICES if s not in targets]
    problems += [
        f"{dockerfile}: target {t} is not in check_policy.SERVICES (add it to be checked)"
        for t in sorted(targets - set(SERVICES) - SHARED_STAGES)
    ]
    for service in SERVICES:
        block = re.search(
            rf"^FROM runtime AS {service}\n(.*?)(?=^FROM |\Z)", dockerfile.read_text(), re.M | re.S
        )
        # A worker's entry point is its unit's control, which launches the worker (ADR 0046).
        command = (
            f'CMD ["python", "-m", "hypermedia.worker.unit", "{service}"]'
            if service.endswith("worker")
            else f'CMD ["python", "-m", "services.{service}"]'
        )
        if block and command not in block.group(1):
            problems.append(f"{dockerfile}: target {service} does not run {command[5:-1]}")
    services = yaml.safe_load(compose_file.read_text())["services"]
    for name, svc in services.items():
        where = f"{compose_file.name}: service {name}"
        limits = svc.get("deploy", {}).get("resources", {}).get("limits", {})
        if not {"cpus", "memory"} <= limits.keys():
            problems.append(f"{where}: deploy.resources.limits needs cpus and memory")
        build = svc.get("build")
        if build is None:
            continue  # third-party image (postgres, nats)
        if build.get("target") not in targets:
            problems.append(f"{where}: build target {build.get('target')!r} is not in the Dockerfile")
        if svc.get("read_only") is not True:
            problems.append(f"{where}: read_only must be true")
        if "ALL" not in svc.get("cap_drop", []):
            problems.append(f"{where}: cap_drop must include ALL")
        if "no-new-privileges:true" not in svc.get("security_opt", []):
            problems.append(f"{where}: security_opt needs no-new-privileges:true")
        mounts = {entry.split(":", 1)[0] for entry in svc.get("tmpfs", [])}
        for path in ("/tmp", "/work"):
            if path not in mounts:
                problems.append(f"{where}: no tmpfs at {path}")
        if "HM_WORKER_QUEUE" in svc.get("environment", {}):
            grace = svc.get("stop_grace_period", "10s")
            if int(str(grace).rstrip("s")) < MIN_WORKER_GRACE_SECONDS:
                problems.append(f"{where}: stop_grace_period {grace} < {MIN_WORKER_GRACE_SECONDS}s")
    return problems


def _stage(dockerfile_text: str, target: str) -> str:
    """The instructions of one target, without comment lines (the comments above the next ``FROM``,
    which describe the next target, would otherwise count as this one's)."""
    block = re.search(rf"^FROM \S+ AS {target}\n(.*?)(?=^FROM |\Z)", dockerfile_text, re.M | re.S)
    lines = block.group(1).splitlines(keepends=True) if block else []
    return "".join(line for line in lines if not line.lstrip().startswith("#"))


def _apt_installs(stage: str) -> set[str]:
    """Package names of the ``apt-get install`` commands of one Dockerfile stage (versions aside)."""
    installs = re.findall(r"apt-get install ((?:[^&]|&(?!&))*)", stage)
    return {
        word.strip("'\"").split("=", 1)[0]
        for args in installs
        for word in args.replace("\\\n", " ").split()
        if not word.startswith("-") and word != "\\"
    }


def _makefile_list(makefile_text: str, variable: str) -> set[str] | None:
    match = re.search(rf"^{variable}\s*:?=((?:.*\\\n)*.*)$", makefile_text, re.M)
    return None if match is None else set(match.group(1).replace("\\\n", " ").split())


def check_apt_packages(makefile: Path, dockerfile: Path) -> list[str]:
    """The targets of ``APT_PACKAGES`` install exactly their Makefile list; the others nothing."""
    text = dockerfile.read_text()
    makefile_text = makefile.read_text() if makefile.exists() else None  # None: deploy/ alone
    problems = []
    for target in SERVICES:
        installed = _apt_installs(_stage(text, target))
        variable = APT_PACKAGES.get(target)
        if variable is None:
            if installed:
                problems.append(
                    f"{dockerfile}: target {target} installs apt packages {sorted(installed)}; only "
                    f"{', '.join(APT_PACKAGES)} do (add it to APT_PACKAGES with its Makefile list)"
                )
            continue
        if makefile_text is None:
            continue
        wanted = _makefile_list(makefile_text, variable)
        if wanted is None:
            problems.append(f"{makefile}: no {variable}")
        elif installed != wanted:
            missing, extra = sorted(wanted - installed), sorted(installed - wanted)
            problems.append(
                f"{dockerfile}: {target} apt packages differ from {makefile.name}'s {variable}: "
                f"missing {missing}, not in the Makefile {extra}"
            )
    if "HM_OFFICE_PYTHON=" not in _stage(text, "docworker"):
        problems.append(f"{dockerfile}: target docworker does not set HM_OFFICE_PYTHON")
    return problems


def _healthcheck_binds(healthcheck: Path) -> dict[str, tuple[str, str]]:
    """``healthcheck.py``'s ``GRPC_BIND_VARIABLES``: ``{service: (variable, default bind)}``."""
    spec = importlib.util.spec_from_file_location("healthcheck", healthcheck)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports grpc only when it probes
    return dict(module.GRPC_BIND_VARIABLES)


def check_healthchecks(dockerfile: Path, healthcheck: Path) -> list[str]:
    """Every target's HEALTHCHECK runs ``healthcheck.py <target>``, a service the script checks."""
    known = {"gateway", *_healthcheck_binds(healthcheck)}
    text = dockerfile.read_text()
    problems = []
    for target in SERVICES:
        stage = _stage(text, target)
        if re.search(r"^HEALTHCHECK NONE$", stage, re.M):
            continue
        named = re.findall(r'"/opt/hypermedia/healthcheck\.py", "([^"]+)"\]', stage)
        if named != [target]:
            problems.append(f"{dockerfile}: target {target} HEALTHCHECK runs healthcheck.py {named}")
        elif target not in known:
            problems.append(f"{healthcheck}: no check for service {target!r} (GRPC_BIND_VARIABLES)")
    return problems


def _worker_targets(dockerfile_text: str) -> dict[str, dict[str, str]]:
    """``{target: {"HM_WORKER_QUEUE": …, "HM_WORKER_SLOTS": …}}`` of the targets that set a queue."""
    workers = {}
    for target in SERVICES:
        env = dict(re.findall(r"\b(HM_WORKER_(?:QUEUE|SLOTS))=(\S+)", _stage(dockerfile_text, target)))
        if "HM_WORKER_QUEUE" in env:
            workers[target] = env
    return workers


def _status_port(dockerfile_text: str, target: str) -> str | None:
    """The port of the image's ``HM_WORKER_STATUS_BIND`` (``0.0.0.0:50071`` → ``50071``)."""
    match = re.search(r"\bHM_WORKER_STATUS_BIND=\S*:(\d+)\b", _stage(dockerfile_text, target))
    return match.group(1) if match else None


def _check_status_port(
    where: str, target: str, port: str | None, container: Doc, healthcheck: Path
) -> list[str]:
    """The worker's status port agrees between the image, ``healthcheck.py`` and the Deployment."""
    if port is None:
        return [f"{where}: the image of {target} sets no HM_WORKER_STATUS_BIND with a port"]
    problems = []
    default = _healthcheck_binds(healthcheck).get(target, ("", ""))[1]
    if default.rsplit(":", 1)[-1] != port:
        problems.append(f"{healthcheck}: default bind {default!r} of {target} is not the image's port {port}")
    bind = _env(container).get("HM_WORKER_STATUS_BIND")
    if bind is not None and bind.rsplit(":", 1)[-1] != port:
        problems.append(f"{where}: HM_WORKER_STATUS_BIND {bind!r} differs from the image's port {port}")
    if int(port) not in {p.get("containerPort") for p in container.get("ports", [])}:
        problems.append(f"{where}: no containerPort {port} (the status port)")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_port = container.get(probe, {}).get("grpc", {}).get("port")
        if grpc_port is not None and str(grpc_port) != port:
            problems.append(f"{where}: {probe} port {grpc_port} is not the status port {port}")
    return problems


def _removes_replicas(kustomization: Doc, deployment: str) -> bool:
    for patch in kustomization.get("patches", []):
        target = patch.get("target", {})
        if target.get("kind") == "Deployment" and target.get("name") == deployment:
            ops = yaml.safe_load(patch.get("patch", "")) or []
            if {"op": "remove", "path": "/spec/replicas"} in ops:
                return True
    return False


def check_workers(deploy: Path) -> list[str]:
    """Each worker target is deployed in k8s/, k8s/keda/ and compose.yaml, with the same queue and
    slots everywhere, its memory never overcommitted and its egress confined."""
    dockerfile = deploy / "docker" / "Dockerfile"
    dockerfile_text = dockerfile.read_text()
    k8s_dir, keda_dir = deploy / "k8s", deploy / "k8s" / "keda"
    docs = list(load_manifests(k8s_dir))
    deployments = {d["metadata"]["name"]: (p, d) for p, d in docs if d.get("kind") == "Deployment"}
    egress_selectors = [
        d["spec"].get("podSelector", {}).get("matchLabels", {})
        for _, d in docs
        if d.get("kind") == "NetworkPolicy" and "Egress" in d["spec"].get("policyTypes", [])
    ]
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]
        for p, d in docs
        if d.get("kind") == "ScaledObject" and p.parent == keda_dir
    }
    keda_kustomization_file = keda_dir / "kustomization.yaml"
    keda_kustomization = (
        yaml.safe_load(keda_kustomization_file.read_text()) if keda_kustomization_file.exists() else {}
    )
    compose_services = yaml.safe_load((deploy / "compose.yaml").read_text())["services"]
    problems = []
    for target, image_env in _worker_targets(dockerfile_text).items():
        found = deployments.get(target)
        if found is None:
            problems.append(f"{k8s_dir}: worker {target} has no Deployment named {target}")
        else:
            path, doc = found
            where = _name(path, doc)
            pod = doc["spec"]["template"]
            containers = [
                c for c in pod["spec"]["containers"] if c.get("image", "").startswith(f"hypermedia/{target}:")
            ]
            if not containers:
                problems.append(f"{where}: no container runs image hypermedia/{target}")
            for container in containers:
                env = _env(container)
                for variable, value in image_env.items():
                    if env.get(variable) != value:
                        problems.append(
                            f"{where}: {variable} {env.get(variable)!r} differs from the image's {value!r}"
                        )
                resources = container.get("resources", {})
                request = resources.get("requests", {}).get("memory")
                limit = resources.get("limits", {}).get("memory")
                if request != limit:
                    problems.append(
                        f"{where}: memory request {request} != limit {limit} (never overcommitted)"
                    )
                problems += _check_status_port(
                    where,
                    target,
                    _status_port(dockerfile_text, target),
                    container,
                    deploy / "docker" / "healthcheck.py",
                )
            labels = pod["metadata"].get("labels", {})
            if not any(selector and selector.items() <= labels.items() for selector in egress_selectors):
                problems.append(f"{where}: no egress NetworkPolicy selects its pods")
        if target not in scaled:
            problems.append(f"{keda_dir}: no ScaledObject targets worker {target}")
        if not _removes_replicas(keda_kustomization, target):
            problems.append(
                f"{keda_kustomization_file}: no patch removes /spec/replicas of Deployment {target}"
            )
        services = [
            (name, svc)
            for name, svc in compose_services.items()
            if (svc.get("build") or {}).get("target") == target
        ]
        if not services:
            problems.append(f"compose.yaml: no service builds worker target {target}")
        for name, svc in services:
            env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
            for variable, value in image_env.items():
                if env.get(variable) != value:
                    problems.append(
                        f"compose.yaml: service {name}: {variable} {env.get(variable)!r} differs from "
                        f"the image's {value!r}"
                    )
    return problems


GRPC_PORTS = {
    "credits": (50061, "/hypermedia.credits.v1.CreditsService/"),
    "storage": (50062, "/hypermedia.storage.v1.StorageService/"),
}
"""The internal gRPC services whose callers the ingress policies name: port, method prefix."""
METRICS_PORT = 9464


def _rights() -> dict[str, frozenset[str]]:
    """hypermedia.infra.mtls.RIGHTS: who may call which internal method."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from hypermedia.infra.mtls import RIGHTS

    return dict(RIGHTS)


def _names(peer: Doc) -> set[str] | None:
    """The ``app.kubernetes.io/name`` values a rule's ``from`` peer admits; None: any pod."""
    selector = peer.get("podSelector")
    if selector is None or peer.get("namespaceSelector") is not None:
        return None
    names = (
        {selector["matchLabels"]["app.kubernetes.io/name"]}
        if "app.kubernetes.io/name" in selector.get("matchLabels", {})
        else set()
    )
    for expression in selector.get("matchExpressions", []):
        if expression["key"] == "app.kubernetes.io/name" and expression["operator"] == "In":
            names |= set(expression["values"])
    return names or None


def check_ingress(k8s_dir: Path) -> list[str]:
    """Every hypermedia pod is isolated for ingress by some NetworkPolicy; its metrics port is
    open to the monitoring namespace only; credits' and storage's gRPC ports admit exactly the
    deployed services hypermedia.infra.mtls.RIGHTS lets call them (so a new caller in the code
    without its rule, or a rule for a service with no right, is caught here)."""
    docs = list(load_manifests(k8s_dir))
    ingress = [
        d
        for _, d in docs
        if d.get("kind") == "NetworkPolicy" and "Ingress" in d["spec"].get("policyTypes", [])
    ]
    deployed = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "Deployment"}
    problems = []

    def selecting(labels: Doc) -> list[Doc]:
        return [
            p for p in ingress if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        ]

    for path, doc in docs:
        if doc.get("kind") not in WORKLOAD_KINDS:
            continue
        pod = _template(doc)
        labels = pod.get("metadata", {}).get("labels", {})
        if labels.get("app.kubernetes.io/part-of") != "hypermedia":
            continue
        where = _name(path, doc)
        policies = selecting(labels)
        if not policies:
            problems.append(f"{where}: no ingress NetworkPolicy selects its pods")
        ports = {port["containerPort"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
        if METRICS_PORT in ports:
            monitoring = [
                peer
                for policy in policies
                for rule in policy["spec"].get("ingress", [])
                if {p.get("port") for p in rule.get("ports", [])} == {METRICS_PORT}
                for peer in rule.get("from", [])
                if peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
            ]
            if not monitoring:
                problems.append(
                    f"{where}: no ingress rule lets a monitoring namespace scrape :{METRICS_PORT}"
                )
    rights = _rights()
    for service, (port, prefix) in GRPC_PORTS.items():
        expected = {who for method, callers in rights.items() if method.startswith(prefix) for who in callers}
        expected &= deployed
        admitted: set[str] = set()
        for policy in selecting(
            {"app.kubernetes.io/name": service, "app.kubernetes.io/part-of": "hypermedia"}
        ):
            for rule in policy["spec"].get("ingress", []):
                if port not in {p.get("port") for p in rule.get("ports", [])}:
                    continue
                for peer in rule.get("from", [{}]):
                    names = _names(peer)
                    if names is None:
                        problems.append(
                            f"{service} ingress: :{port} is open to any pod, not only its callers"
                        )
                    else:
                        admitted |= names
        if admitted != expected:
            problems.append(
                f"{service} ingress: :{port} admits {sorted(admitted)}, the code's callers are {sorted(expected)}"
            )
    return problems


def main(argv: list[str]) -> int:
    deploy = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    dockerfile = deploy / "docker" / "Dockerfile"
    problems = (
        check_k8s(deploy / "k8s")
        + check_ingress(deploy / "k8s")
        + check_compose(deploy / "compose.yaml", dockerfile)
        + check_healthchecks(dockerfile, deploy / "docker" / "healthcheck.py")
        + check_workers(deploy)
        + check_apt_packages(deploy.parent / "Makefile", dockerfile)
        + check_worker_seccomp(deploy / "k8s" / "seccomp" / "hypermedia-worker.json")
        + (
            []
            if "HM_SANDBOX_REQUIRE=full" in dockerfile.read_text()
            else [f"{dockerfile}: the runtime stage must set HM_SANDBOX_REQUIRE=full"]
        )
    )
    for problem in problems:
        print(problem)
    print(f"check_policy: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
