"""The worker unit of seed 001 (ADR 0046): **control** (:mod:`~hypermedia.worker.unit.control`, the
container's PID 1: configuration, identity, the deployment lease (:mod:`~hypermedia.worker.unit.lease`),
the autoscaler (:mod:`~hypermedia.worker.unit.autoscaler` on :mod:`~hypermedia.worker.unit.evidence`),
containment) and **execution** (a worker service, :mod:`hypermedia.worker.serve`: consumers, zygote,
job children), talking over a private Unix socket fenced by boot, epoch and generation
(:mod:`~hypermedia.worker.unit.peer`)."""
