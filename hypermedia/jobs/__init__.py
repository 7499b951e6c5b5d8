"""The job system: the states of a job and its attempts (:mod:`~hypermedia.jobs.lifecycle`, the only
writer of ``processing_jobs`` and ``job_attempts``), the transactional outbox
(:mod:`~hypermedia.jobs.outbox`), the JetStream queues (:mod:`~hypermedia.jobs.queues`), job params
(:mod:`~hypermedia.jobs.params`) and document passwords (:mod:`~hypermedia.jobs.secrets`), job
events (:mod:`~hypermedia.jobs.events`) and webhook delivery rules (:mod:`~hypermedia.jobs.webhooks`).

May import: :mod:`hypermedia.core`, :mod:`hypermedia.infra`, :mod:`hypermedia.api`.
"""
