"""The ``noop`` operation (ADR 0038): a job that does nothing, so that the job system itself —
create, hold, outbox, relay, claim, lease, complete, settle, events — can be measured
(``bench/job_throughput.py``, issue 17's P6) and tested without any engine's cost.

It can never run, or cost anything, by accident:

* its profile (migration 0018) is priced at zero, and a ``CHECK`` on ``processing_profiles``
  keeps it so: no change of the profile can ever bill it;
* the gateway refuses it with ``422 OPERATION_NOT_ENABLED`` unless ``HM_NOOP_OPERATION=1``;
* a worker without ``HM_NOOP_OPERATION=1`` fails such a job at once with the same code
  (a permanent failure: its zero hold is released).

Production never sets ``HM_NOOP_OPERATION``; tests and benchmarks do.
"""

from __future__ import annotations

OPERATION = "noop"
"""The operation's name (``processing_profiles.operation``), on the ``images`` queue."""

NOT_ENABLED = "OPERATION_NOT_ENABLED"
"""The error code of a ``noop`` request, or job, where ``HM_NOOP_OPERATION`` is not set."""

NOT_ENABLED_MESSAGE = (
    "operation 'noop' is for benchmarks and tests; it runs only where HM_NOOP_OPERATION=1 is set"
)
"""The public message that goes with :data:`NOT_ENABLED`."""
