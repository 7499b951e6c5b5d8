"""The job system: the states of a job and its attempts (:mod:`~hypermedia.jobs.lifecycle`, the only
writer of ``processing_jobs`` and ``job_attempts``), the transactional outbox
(:mod:`~hypermedia.jobs.outbox`), the JetStream queues (:mod:`~hypermedia.jobs.queues`), document passwords
(:mod:`~hypermedia.jobs.secrets`), the credit settlement of ended jobs
(:mod:`~hypermedia.jobs.settlement`), accounts and API keys (:mod:`~hypermedia.jobs.accounts`), job
events (:mod:`~hypermedia.jobs.events`) and webhook delivery rules (:mod:`~hypermedia.jobs.webhooks`).

May import: :mod:`hypermedia.core`, :mod:`hypermedia.infra`, :mod:`hypermedia.api`.
"""
