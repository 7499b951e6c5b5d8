"""The plumbing under every service: Postgres and its migrations (:mod:`~hypermedia.infra.db`), the gRPC
server and channels (:mod:`~hypermedia.infra.rpc`), the HTTP server protocol with connection
limits (:mod:`~hypermedia.infra.httpserver`) and a service process's lifecycle and exit codes
(:mod:`~hypermedia.infra.service`).

May import: :mod:`hypermedia.core` and :mod:`hypermedia.api`.
"""
