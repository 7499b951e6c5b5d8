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
from hypermedia.jobs import queues
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
    uids_per_slot: int = 1
    """Sandbox uids one slot takes with root (the docworker's: a job's and a listener's)."""


ROLES: Final = {
    "imageworker": Role("imageworker", "images", 4, "hypermedia.engines.imaging.params:OPERATIONS"),
    "docworker": Role(
        "docworker",
        "documents",
        2,
        "hypermedia.engines.documents.params:OPERATIONS",
        ("hypermedia.engines.documents.settings:OfficeSettings",),
        uids_per_slot=2,
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

ROLE_OF_QUEUE: Final = {role.queue: role for role in ROLES.values()}

ROLE_OF_ROUTE: Final = ROLE_OF_QUEUE | {queues.bulk_route(role.queue): role for role in ROLES.values()}
"""The role that serves each route: an engine's queue, and that engine's lane of the bulk queue
(``bulk.images`` → the imageworker; ADR 0057)."""

SCHEDULER_SLOTS: Final = 1
"""The slot of the scheduler consumer beside each engine's queue (ADR 0073; a bulk lane has none):
:data:`hypermedia.worker.scheduled.SLOTS`, whose uids a plan reserves."""

QUEUES_VARIABLE: Final = "HM_WORKER_QUEUES"
"""The queues of a worker of several (:mod:`services.multiworker`): ``images=4,documents=2``."""

UID_RANGE: Final = 64
"""Sandbox uids one worker process takes from ``HM_SANDBOX_UID_BASE`` with root (the range
``hypermedia up`` gives each replica: ``platform.UID_RANGE_PER_REPLICA``)."""

MULTI_QUEUE_MODULE: Final = "services.multiworker"


@dataclass(frozen=True)
class LanePlan:
    """One queue of a worker of several: its role, slots, where its sandbox uids start
    (``uid_offset`` above ``HM_SANDBOX_UID_BASE``) and the route it consumes (``images`` or
    ``bulk.images``; the role's queue when not given)."""

    role: Role
    slots: int
    uid_offset: int
    queue: str = ""

    def __post_init__(self) -> None:
        if not self.queue:
            object.__setattr__(self, "queue", self.role.queue)


def plan_lanes(spec: str, *, variable: str, as_root: bool) -> tuple[LanePlan, ...]:
    """The lanes of ``spec``, a comma list of routes (:data:`ROLE_OF_ROUTE`: a queue, or an
    engine's bulk lane such as ``bulk.images``) each with its slots or not (``images=4,documents``:
    the role's default slots). ``variable`` names the spec in messages (``--queues`` or
    :data:`QUEUES_VARIABLE`).

    Raises:
        ValueError: an unknown or repeated route, slots that are not 1-64, an empty list, or
            (``as_root``) lanes whose uids do not fit in :data:`UID_RANGE`; the message names
            ``variable``.
    """
    plans: list[LanePlan] = []
    offset = 0
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or not all(items):
        raise ValueError(f"{variable}: give queues as a comma list, e.g. images=4,documents=2")
    for item in items:
        queue, sep, count = item.partition("=")
        queue = queue.strip()
        role = ROLE_OF_ROUTE.get(queue)
        if role is None:
            raise ValueError(f"{variable}: {queue[:32]!r} is not one of {', '.join(ROLE_OF_ROUTE)}")
        if any(plan.queue == queue for plan in plans):
            raise ValueError(f"{variable}: {queue} is given twice")
        count = count.strip()
        if sep and not (count.isascii() and count.isdigit() and len(count) <= 2 and 1 <= int(count) <= 64):
            raise ValueError(f"{variable}: the slots of {queue} must be a whole number 1-64")
        slots = int(count) if sep else role.default_slots
        plans.append(LanePlan(role, slots, offset, queue))
        # An engine's queue has its scheduler consumer's slot after its own (ADR 0073).
        offset += (slots + (0 if queues.is_bulk(queue) else SCHEDULER_SLOTS)) * role.uids_per_slot
    if as_root and offset > UID_RANGE:
        raise ValueError(
            f"{variable}: the lanes take {offset} sandbox uids with root (a docworker slot takes 2, "
            f"each queue's scheduler consumer one slot), more than the {UID_RANGE} of one worker"
        )
    return tuple(plans)


def consumer_uids_problem(role: Role, slots: int) -> str | None:
    """With root: why ``slots`` slots of ``role`` and its scheduler consumer's (ADR 0073) do not
    fit in the :data:`UID_RANGE` sandbox uids of one worker process, or None when they do."""
    per_slot = role.uids_per_slot
    if (slots + SCHEDULER_SLOTS) * per_slot <= UID_RANGE:
        return None
    return (
        f"HM_WORKER_SLOTS: with root the {role.name} runs at most {UID_RANGE // per_slot - SCHEDULER_SLOTS} "
        f"slots beside its scheduler consumer (HM_WORKER_SCHEDULER=off: {UID_RANGE // per_slot})"
    )


def is_set(environ: dict[str, str], name: str) -> bool:
    """Whether ``name`` (or its deprecated name) is in ``environ`` at all, empty included,
    compared case-insensitively as the settings read it."""
    return config.lookup(environ, name, "\0") != "\0"


def lanes_spec(plans: tuple[LanePlan, ...]) -> str:
    """The :data:`QUEUES_VARIABLE` value of ``plans``, every slot count given."""
    return ",".join(f"{plan.queue}={plan.slots}" for plan in plans)


REFUSED: Final = {
    peer.ENV_SOCKET: "control makes the unit's socket",
    peer.ENV_EPOCH: "the epoch is the deployment lease's",
    peer.ENV_GENERATION: "control numbers execution's launches",
    peer.ENV_CONTROL_PID: "control hands its pid to its execution",
    "HM_WORKER_ID": "a worker's id is derived from the deployment, boot, role and generation",
    "HM_CONSUMER_NAME": "consumer names are derived from the queue and band (hypermedia/jobs/queues.py)",
    QUEUES_VARIABLE: "control sets it from --queues",
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
    status_silence_seconds: float = Field(
        30.0, ge=3, le=600, validation_alias="HM_UNIT_STATUS_SILENCE_SECONDS"
    )
    """A ready execution reports status every second; silent this long (stopped with SIGSTOP, or
    its event loop stuck) it is treated as dead: contained, its jobs handed back, relaunched."""
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
class LaneConfig:
    """One queue of the unit: the role that serves it and its worker settings (queue, slots)."""

    role: Role
    worker: WorkerSettings


@dataclass(frozen=True)
class Configuration:
    """Everything control read, validated: its own settings, the connections, each lane's."""

    lanes: tuple[LaneConfig, ...]
    unit: UnitSettings
    infra: config.InfraSettings
    unit_name: str
    coordinator_bounds: dict[str, int]
    """Operation → jobs at once of the unit's media coordinator (empty: none)."""
    plans: tuple[LanePlan, ...] = ()
    """The lanes of ``--queues`` (empty: a unit of one role)."""

    @property
    def worker(self) -> WorkerSettings:
        """The settings the lanes share (deployment, drain, timings): the first lane's."""
        return self.lanes[0].worker

    @property
    def name(self) -> str:
        """``imageworker`` for a unit of one role, ``worker`` for one of several queues."""
        return self.lanes[0].role.name if not self.plans else "worker"

    @property
    def module(self) -> str:
        """What execution runs: ``services.{role}``, or :data:`MULTI_QUEUE_MODULE`."""
        return f"services.{self.lanes[0].role.name}" if not self.plans else MULTI_QUEUE_MODULE


def validate(
    role_name: str | None, unit_option: str | None, queues_option: str | None = None
) -> Configuration:
    """Check the whole configuration of a unit of ``role_name``, or of the queues of
    ``queues_option`` (``--queues``: :func:`plan_lanes`), before anything is launched: the refused
    variables (:data:`REFUSED`), control's settings, the connections' forms (``HM_DATABASE_URL``,
    ``HM_NATS_URL``, ``HM_STORAGE_ADDR``, ``HM_CREDITS_ADDR``), each lane's worker settings with
    its queue and slots, each role's own settings and the internal TLS files. A unit of
    ``--queues`` (one or several) takes its queues and slots from there only: ``HM_WORKER_QUEUE``
    and ``HM_WORKER_SLOTS`` are refused.

    Raises:
        config.ConfigError: every problem found, each naming its variable and never a value (exit 78).
    """
    env = dict(os.environ)
    problems = [
        f"{name}: must not be set: {why}" for name, why in REFUSED.items() if config.lookup(env, name)
    ]
    plans: tuple[LanePlan, ...] = ()
    roles: list[tuple[Role, int | None, str | None]] = []
    """Per lane: its role, its slots from --queues and its route from --queues (None: the
    environment's, else the role's)."""
    if (role_name is None) == (queues_option is None):
        problems.append("give a role or --queues, not both and not neither")
    elif queues_option is not None:
        try:
            plans = plan_lanes(queues_option, variable="--queues", as_root=os.geteuid() == 0)
        except ValueError as exc:
            problems.append(str(exc))
        roles = [(plan.role, plan.slots, plan.queue) for plan in plans]
        problems.extend(
            f"{name}: must not be set with --queues: give the queues and their slots there"
            for name in ("HM_WORKER_QUEUE", "HM_WORKER_SLOTS")
            if is_set(env, name)
        )
    elif (role := ROLES.get(role_name or "")) is None:
        problems.append(f"role: {role_name!r} is not one of {', '.join(sorted(ROLES))}")
    else:
        roles = [(role, None, None)]
    loaded: dict[str, object] = {}

    def worker_loader(role: Role, slots: int | None, route: str | None):  # type: ignore[no-untyped-def]
        return lambda: config.load(
            WorkerSettings, HM_WORKER_QUEUE=route or role.queue, HM_WORKER_SLOTS=slots or role.default_slots
        )

    for key, load in (
        ("unit", lambda: config.load(UnitSettings)),
        ("infra", lambda: config.load(config.InfraSettings)),
        *(
            (f"worker:{route or role.queue}", worker_loader(role, slots, route))
            for role, slots, route in roles
        ),
        *((path, _settings_loader(path)) for role, _, _ in roles for path in role.settings),
        ("tls", mtls.from_environment),
    ):
        if key in loaded:
            continue
        try:
            loaded[key] = load()
        except config.ConfigError as exc:
            problems.extend(
                line.strip()
                for line in str(exc).splitlines()[1:] or [str(exc)]
                if line.strip() not in problems
            )
        except (ValueError, OSError) as exc:
            problems.append(str(exc))
    lanes = []
    for role, _, route in roles:
        worker = loaded.get(f"worker:{route or role.queue}")
        if isinstance(worker, WorkerSettings):
            if worker.queue not in (role.queue, queues.bulk_route(role.queue)):
                problems.append(
                    f"HM_WORKER_QUEUE: the {role.name} consumes {role.queue} or "
                    f"{queues.bulk_route(role.queue)} only"
                )
            elif not plans and worker.scheduler == "on" and worker.queue == role.queue and os.geteuid() == 0:
                problems.extend(filter(None, [consumer_uids_problem(role, worker.slots)]))
            lanes.append(LaneConfig(role, worker))
    unit = loaded.get("unit")
    unit_name = ""
    if unit_option is not None and not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", unit_option):
        problems.append("--unit: must be a lowercase name of letters, digits and '-', 1-63 long")
    if isinstance(unit, UnitSettings):
        if unit_option is not None and unit.unit and unit.unit != unit_option:
            problems.append("HM_UNIT_NAME: differs from --unit; give one, or the same in both")
        # The queues in a fixed order: --queues=documents,images is the same unit (and lease).
        ordered = [route.replace(".", "-") for route in ROLE_OF_ROUTE if any(p.queue == route for p in plans)]
        default = "-".join(["worker", *ordered]) if plans else (roles[0][0].name if roles else "")
        unit_name = unit_option or unit.unit or default
    if problems:
        raise config.ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    assert isinstance(unit, UnitSettings) and lanes
    infra = loaded["infra"]
    assert isinstance(infra, config.InfraSettings)
    bounds: dict[str, int] = {}
    for lane in lanes:
        if lane.role.coordinator:
            bounds |= loaded[lane.role.coordinator].coordinator_bounds()  # type: ignore[attr-defined]
    return Configuration(tuple(lanes), unit, infra, unit_name, bounds, plans)


def _settings_loader(path: str):  # type: ignore[no-untyped-def]
    def load() -> object:
        return config.load(pkgutil.resolve_name(path))

    return load
