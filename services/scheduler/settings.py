"""The scheduler's settings: its cycle, the pools, the freshness of its inputs and the local
provider's directories. Every variable is in docs/operations.md ("Scheduler")."""

from __future__ import annotations

from pydantic import Field, field_validator

from hypermedia.core.config import ComponentSettings
from services.scheduler.pools import Pool, parse_pools


class SchedulerSettings(ComponentSettings):
    interval_seconds: float = Field(15.0, gt=0, le=3600, validation_alias="HM_SCHEDULER_INTERVAL_SECONDS")
    """One cycle (:meth:`Scheduler.run_once`) this often; a standby tries to become leader as often."""
    pools_json: str = Field("[]", validation_alias="HM_SCHEDULER_POOLS")
    """The pools: a JSON list of :class:`~services.scheduler.pools.Pool`, or ``@path`` of a file."""
    arrival_window_seconds: float = Field(120.0, gt=0, validation_alias="HM_SCHEDULER_ARRIVAL_WINDOW_SECONDS")
    """The arrival rate is the jobs created within this long, per second."""
    stale_seconds: float = Field(90.0, gt=0, validation_alias="HM_SCHEDULER_STALE_SECONDS")
    """A worker whose heartbeat is older than this makes the inputs stale: no scale-down, at most
    one start (three of the workers' default 30 s heartbeats)."""
    drain_timeout_seconds: float = Field(120.0, gt=0, validation_alias="HM_SCHEDULER_DRAIN_TIMEOUT_SECONDS")
    """A burst worker still draining this long after it was asked is terminated (its jobs' leases
    then expire and the reaper requeues them)."""
    local_dir: str = Field(".hypermedia/scheduler", validation_alias="HM_SCHEDULER_LOCAL_DIR")
    """The local provider's launch records and the burst workers' work directories."""
    local_log_dir: str = Field("", validation_alias="HM_SCHEDULER_LOCAL_LOG_DIR")
    """The burst workers' logs (default ``{HM_SCHEDULER_LOCAL_DIR}/logs``)."""
    local_uid_base: int = Field(63000, ge=1, le=2**31 - 1, validation_alias="HM_SCHEDULER_LOCAL_UID_BASE")
    """The first sandbox uid of the local burst workers; each takes 64 from here."""
    local_tls_dir: str = Field("", validation_alias="HM_SCHEDULER_LOCAL_TLS_DIR")
    """Where ``{role}.pem`` / ``{role}-key.pem`` / ``ca.pem`` are for the local burst workers'
    mutual TLS; empty: they get no certificates (``HM_INTERNAL_AUTH=none``)."""
    local_stop_on_exit: bool = Field(False, validation_alias="HM_SCHEDULER_LOCAL_STOP_ON_EXIT")
    """Terminate the local burst workers when the scheduler stops (``hypermedia up`` sets it)."""

    keda_bind: str = Field("", validation_alias="HM_SCHEDULER_KEDA_BIND")
    """``host:port`` of KEDA's External Scaler API (services/scheduler/keda.py), plaintext gRPC for
    the keda-operator (restrict it by NetworkPolicy); empty: not served. Every scheduler replica
    serves it, leader or standby: it only reads Postgres."""
    ec2_region: str = Field("", validation_alias="HM_SCHEDULER_EC2_REGION")
    """The ``ec2`` pools' region; empty: boto3's own (``AWS_REGION``, the profile). Credentials come
    from boto3's chain (environment, profile, instance role)."""
    ec2_endpoint_url: str = Field("", validation_alias="HM_SCHEDULER_EC2_ENDPOINT_URL")
    """Another EC2 endpoint (a VPC endpoint; moto in the contract tests); empty: AWS's."""

    kubeconfig: str = Field("", validation_alias="HM_SCHEDULER_KUBECONFIG")
    """The ``kubernetes`` pools' cluster: a kubeconfig file; empty: the scheduler pod's service
    account (in-cluster; its Role: deploy/k8s/scheduler.yaml)."""
    kube_context: str = Field("", validation_alias="HM_SCHEDULER_KUBE_CONTEXT")
    """The kubeconfig's context; empty: its current one."""

    @field_validator("pools_json")
    @classmethod
    def _pools(cls, value: str) -> str:
        try:
            parse_pools(value)
        except OSError as exc:
            raise ValueError(f"the pools file cannot be read: {exc.strerror}") from None
        return value

    @property
    def pools(self) -> tuple[Pool, ...]:
        return parse_pools(self.pools_json)
