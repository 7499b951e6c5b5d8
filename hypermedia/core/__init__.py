"""What every part of the platform shares: the error model (:mod:`~hypermedia.core.errors`), the
settings every process reads (:mod:`~hypermedia.core.config`), the rule for request strings
(:mod:`~hypermedia.core.pgtext`) and tracing (:mod:`~hypermedia.core.telemetry`).

May import: the standard library and third-party packages only; every other package imports it.
"""
