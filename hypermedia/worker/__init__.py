"""A worker process: the loop that fetches, claims, runs and settles jobs (:mod:`~hypermedia.worker.runtime`)
and the process around it, with its gRPC health and drain service (:mod:`~hypermedia.worker.serve`).

May import: :mod:`hypermedia.core`, :mod:`hypermedia.infra`, :mod:`hypermedia.jobs`,
:mod:`hypermedia.sandbox`, :mod:`hypermedia.api`; engines only by name (the sandbox entry string).
"""
