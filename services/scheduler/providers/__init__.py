"""Where burst workers run: the :class:`Provider` protocol and its implementations.

A provider knows nothing of jobs or of the formula: it launches one worker process of a pool
(tagged with its burst worker id, so that a new leader finds what an old one launched), lists
them, describes one and terminates one. The scheduler terminates only after the drain handshake
(the worker reported it stopped) or for a failed boot (docs/adr/0047-scheduler.md).

Adding a provider (Google Compute, IONOS, ...): a module here with a class meeting
:class:`Provider` on the cloud's official client, a name in ``pools.ProviderName``, a branch in
:func:`services.scheduler.__main__.open_providers`, and contract tests against the closest honest stand-in of its API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from services.scheduler.pools import Pool


@dataclass(frozen=True)
class Instance:
    """One launched worker as its provider sees it: ``running`` (launched, maybe still booting),
    or ``stopped`` (it exited or was terminated; ``detail`` says how)."""

    burst_worker_id: str
    provider_ref: str
    state: Literal["running", "stopped"]
    detail: str = ""


class Provider(Protocol):
    """What the scheduler asks of a provider. Every method may raise an error of its client
    (the scheduler records it on the burst worker and retries at the next cycle)."""

    name: str

    async def launch(self, pool: Pool, burst_worker_id: str) -> str:
        """Launches one worker of ``pool`` for ``burst_worker_id``; returns the provider's
        reference to it (a pid, a pod name, an instance id)."""
        ...

    async def list(self, pool: Pool) -> list[Instance]:
        """The workers of ``pool`` this provider launched and still knows of."""
        ...

    async def describe(self, provider_ref: str) -> Instance | None:
        """One worker by reference; None when the provider knows nothing of it."""
        ...

    async def terminate(self, provider_ref: str) -> None:
        """Ends the worker (after its drain, or a failed boot); returns once it is gone or
        going. Terminating one that is gone already is not an error."""
        ...

    async def close(self) -> None:
        """Called once when the scheduler stops."""
        ...
