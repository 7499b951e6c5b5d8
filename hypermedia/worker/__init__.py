"""A worker process: the loop that fetches, claims, runs and settles jobs (:mod:`~hypermedia.worker.runtime`),
whether it takes another job now (:mod:`~hypermedia.worker.admission`), moving a job's bytes through
presigned URLs (:mod:`~hypermedia.worker.transfer`), what a service plugs in
(:mod:`~hypermedia.worker.handler`), its row in ``workers`` (:mod:`~hypermedia.worker.registry`), its
settings (:mod:`~hypermedia.worker.settings`) and the process around it, with its gRPC status
service (:mod:`~hypermedia.worker.serve`).

May import: :mod:`hypermedia.core`, :mod:`hypermedia.infra`, :mod:`hypermedia.jobs`,
:mod:`hypermedia.sandbox`, :mod:`hypermedia.api` and the engine contract; engines only by name (the
sandbox entry string).
"""
