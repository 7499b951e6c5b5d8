"""The gateway's use cases, one object per use case, as the transports receive them."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.accounts import Accounts
from services.gateway.backfills import Backfills
from services.gateway.cancellation import JobCancellation
from services.gateway.catalogue import OperationCatalogue
from services.gateway.creation import JobCreation
from services.gateway.operators import SchedulerAdmin
from services.gateway.presets import Presets
from services.gateway.schedules import Schedules
from services.gateway.status import JobStatus
from services.gateway.uploads import Uploads


@dataclass(frozen=True)
class UseCases:
    """What REST (:func:`services.gateway.rest.build_app`) and gRPC
    (:class:`services.gateway.grpc_api.JobService`) both call; wired in ``__main__``. Each returns
    the typed results of :mod:`services.gateway.results`, which each transport renders."""

    uploads: Uploads
    """Upload and delete originals."""
    creation: JobCreation
    """Create jobs (``process``) and list the OCR languages they may ask for."""
    status: JobStatus
    """Read a job and watch its events."""
    cancellation: JobCancellation
    """Cancel a job."""
    accounts: Accounts
    """The caller's account and balance."""
    operators: SchedulerAdmin
    """The scheduler's pools, burst workers and decisions, for admin accounts."""
    presets: Presets
    """The caller's named presets."""
    backfills: Backfills
    """The caller's backfill runs."""
    schedules: Schedules
    """The caller's schedules and their runs."""
    catalogue: OperationCatalogue
    """The operations a request may name, with their params schemas, prices and limits."""
