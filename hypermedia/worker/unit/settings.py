"""The settings of a worker unit's control (``HM_UNIT_*``), the roles it can launch, and
:func:`validate`: the whole configuration checked before execution is launched."""

from __future__ import annotations

import os
import pkgutil
import re
from dataclasses import dataclass
from typing import Final

from pydantic import Field, field_validator

from hypermedia.core import config
from hypermedia.core.config import ComponentSettings
from hypermedia.infra import mtls
from hypermedia.sandbox import cgroups
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit import peer


@dataclass(frozen=True)
class Role:
    """A worker service control can launch as its execution: ``python -m services.{name}``, the
    queue it consumes, its default slots, the settings classes of its own (``module:Class``) and
    the one of them, if any, whose ``coordinator_bounds()`` control's media coordinator keeps."""

    name: str
    queue: str
    default_slots: int
    operations: str
    """``module:NAME`` of the tuple of operations its handler runs."""
    settings: tuple[str, ...] = ()
    coordinator: str = ""


ROLES: Final = {
    "imageworker": Role("imageworker", "images", 4, "hypermedia.engines.imaging.params:OPERATIONS"),
    "docworker": Role(
        "docworker",
        "documents",
        2,
        "hypermedia.engines.documents.params:OPERATIONS",
        ("hypermedia.engines.documents.settings:OfficeSettings",),
    ),
    "ocrworker": Role("ocrworker", "ocr", 2, "hypermedia.engines.ocr.params:OPERATIONS"),
    "mediaworker": Role(
        "mediaworker",
        "media",
        1,
        "hypermedia.engines.media.params:OPERATIONS",
        ("services.mediaworker.settings:MediaSettings",),
        coordinator="services.mediaworker.settings:MediaSettings",
    ),
}
"""The roles, by the name given to ``python -m hypermedia.worker.unit``."""

REFUSED: Final = {
    peer.ENV_SOCKET: "control makes the unit's socket",
    peer.ENV_EPOCH: "the epoch is the deployment lease's",
    peer.ENV_GENERATION: "control numbers execution's launches",
    peer.ENV_CONTROL_PID: "control hands its pid to its execution",
    "HM_WORKER_ID": "a worker's id is derived from the deployment, boot, role and generation",
    "HM_CONSUMER_NAME": "consumer names are derived from the queue and band (hypermedia/jobs/queues.py)",
}
"""Variables control refuses to inherit (exit 78): the unit's identity is control's to derive, and
consumer names are not overridable."""


class UnitSettings(ComponentSettings):
    """Control's own settings."""

    unit: str = Field("", validation_alias="HM_UNIT_NAME", pattern=r"^$|^[a-z][a-z0-9-]{0,62}$")
    """The unit's name in its deployment, the lease's key with ``HM_DEPLOYMENT`` (default: the
    role). When ``--unit`` is given too, the two must be equal."""
    boot: str = Field("", validation_alias="HM_UNIT_BOOT", pattern=r"^$|^[0-9a-f-]{8,64}$")
    """The boot id of this start (a Pod's uid, say); a fresh random one when unset."""
    lease_seconds: float = Field(15.0, ge=3, le=300, validation_alias="HM_UNIT_LEASE_SECONDS")
    """Time to live of the deployment lease; renewed every third of it."""
    cgroup: str = Field("auto", validation_alias="HM_UNIT_CGROUP")
    """Execution's own cgroup, the autoscaler's evidence: ``auto`` (under control's, where it is
    delegated), ``off`` (no measurements: admission holds at one), or a path as for
    ``HM_SANDBOX_CGROUP``."""
    memory_mb: int = Field(0, ge=0, le=1_048_576, validation_alias="HM_UNIT_MEMORY_MB")
    """Memory limit of execution's cgroup in MiB (0: none of its own; the container's applies)."""
    pids_max: int = Field(0, ge=0, le=4_194_304, validation_alias="HM_UNIT_PIDS_MAX")
    """``pids.max`` of execution's cgroup (0: none of its own)."""
    sample_seconds: float = Field(1.0, ge=0.1, le=10, validation_alias="HM_UNIT_SAMPLE_SECONDS")
    """How often control samples execution's cgroup and the backlog, and decides admission."""
    run_dir: str = Field("", validation_alias="HM_UNIT_RUN_DIR")
    """Where the private socket's directory is made (mode 0700): default ``$XDG_RUNTIME_DIR``, else
    the system's temporary directory."""

    @field_validator("cgroup")
    @classmethod
    def _cgroup_setting(cls, value: str) -> str:
        if (problem := cgroups.setting_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("run_dir")
    @classmethod
    def _writable_dir(cls, value: str) -> str:
        if value and not (
            os.path.isabs(value) and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK)
        ):
            raise ValueError("must be an absolute path of an existing directory control can write")
        return value


@dataclass(frozen=True)
class Configuration:
    """Everything control read, validated: its own settings, the connections, execution's."""

    role: Role
    unit: UnitSettings
    infra: config.InfraSettings
    worker: WorkerSettings
    unit_name: str
    coordinator_bounds: dict[str, int]
    """Operation → jobs at once of the unit's media coordinator (empty: none)."""


def validate(role_name: str, unit_option: str | None) -> Configuration:
    """Check the whole configuration of a unit of ``role_name`` before anything is launched: the
    refused variables (:data:`REFUSED`), control's settings, the connections' forms
    (``HM_DATABASE_URL``, ``HM_NATS_URL``, ``HM_STORAGE_ADDR``, ``HM_CREDITS_ADDR``), the worker's
    settings with the role's queue and slots, the role's own settings and the internal TLS files.

    Raises:
        config.ConfigError: every problem found, each naming its variable and never a value (exit 78).
    """
    env = dict(os.environ)
    problems = [
        f"{name}: must not be set: {why}" for name, why in REFUSED.items() if config.lookup(env, name)
    ]
    role = ROLES.get(role_name)
    if role is None:
        problems.append(f"role: {role_name!r} is not one of {', '.join(sorted(ROLES))}")
    loaded: dict[str, object] = {}
    for key, load in (
        ("unit", lambda: config.load(UnitSettings)),
        ("infra", lambda: config.load(config.InfraSettings)),
        (
            "worker",
            lambda: (
                config.load(WorkerSettings, HM_WORKER_QUEUE=role.queue, HM_WORKER_SLOTS=role.default_slots)
                if role
                else None
            ),
        ),
        *((path, _settings_loader(path)) for path in (role.settings if role else ())),
        ("tls", mtls.from_environment),
    ):
        try:
            loaded[key] = load()
        except config.ConfigError as exc:
            problems.extend(line.strip() for line in str(exc).splitlines()[1:] or [str(exc)])
        except (ValueError, OSError) as exc:
            problems.append(str(exc))
    worker = loaded.get("worker")
    if role is not None and isinstance(worker, WorkerSettings) and worker.queue != role.queue:
        problems.append(f"HM_WORKER_QUEUE: the {role.name} consumes {role.queue} only")
    unit = loaded.get("unit")
    unit_name = ""
    if unit_option is not None and not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", unit_option):
        problems.append("--unit: must be a lowercase name of letters, digits and '-', 1-63 long")
    if isinstance(unit, UnitSettings):
        if unit_option is not None and unit.unit and unit.unit != unit_option:
            problems.append("HM_UNIT_NAME: differs from --unit; give one, or the same in both")
        unit_name = unit_option or unit.unit or role_name
    if problems:
        raise config.ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    assert role is not None and isinstance(unit, UnitSettings) and isinstance(worker, WorkerSettings)
    infra = loaded["infra"]
    assert isinstance(infra, config.InfraSettings)
    bounds = loaded[role.coordinator].coordinator_bounds() if role.coordinator else {}  # type: ignore[attr-defined]
    return Configuration(role, unit, infra, worker, unit_name, bounds)


def _settings_loader(path: str):  # type: ignore[no-untyped-def]
    def load() -> object:
        return config.load(pkgutil.resolve_name(path))

    return load
