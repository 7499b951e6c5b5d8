"""The one way a service process runs: configure telemetry, wire dependencies in an
``AsyncExitStack``, serve until SIGTERM/SIGINT, then unwind in reverse order.

Exit codes (documented in docs/operations.md):

====  =====================================================================
0     stopped on a signal after a clean shutdown (also when the signal came during start-up)
69    a dependency (Postgres, NATS, a peer service) was unreachable at start, or start-up took
      longer than 30 s (EX_UNAVAILABLE)
70    an unexpected internal error, or a background loop of the service died (EX_SOFTWARE)
71    a worker unit's control could not contain its execution: a process of it outlived SIGKILL
      (EX_OSERR)
75    a worker unit's deployment lease is held by another live unit, was lost, or fenced this one
      (EX_TEMPFAIL: start it again once the other unit's lease has expired)
78    invalid configuration; the message names each variable, never a value (EX_CONFIG)
====  =====================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2_grpc
from hypermedia.core import metrics, telemetry
from hypermedia.core.config import ConfigError, InfraSettings
from hypermedia.infra import db, rpc
from hypermedia.infra.mtls import Tls

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_UNAVAILABLE = 69
EXIT_SOFTWARE = 70
EXIT_CONTAINMENT = 71
EXIT_LEASE = 75
EXIT_CONFIG = 78

STARTUP_TIMEOUT_SECONDS = 30.0
"""Longest a service may take to open its dependencies and start serving (the app:worker
reference's startup admission deadline); past it the service exits 69."""


class Lifetime(asyncio.Event):
    """The stop signal handed to ``serve``: set by SIGTERM/SIGINT, or by :meth:`fail` when a
    background loop of the service died, which makes the process exit 70 instead of 0."""

    failure: str | None = None
    code: int = 70

    def fail(self, reason: str, code: int = 70) -> None:
        """Stop the service, which then exits ``code`` (70, EX_SOFTWARE, unless told)."""
        self.failure = reason
        self.code = code
        self.set()


class ExitWith(Exception):
    """Raised by a service's start to end it with ``code`` (e.g. 75: a worker unit's execution
    fenced by a newer epoch); the message goes to stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


Serve = Callable[[AsyncExitStack, Lifetime], Awaitable[Any]]


async def every(
    interval: float,
    run_once: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    *,
    first_after: bool = False,
    wake: asyncio.Event | None = None,
) -> None:
    """Call ``run_once`` every ``interval`` seconds until ``stop`` (the thin loop around a
    ``run_once()`` that STYLE asks for). A failing run is logged and the loop goes on. With
    ``first_after`` the first run waits one interval; ``wake``, when set, starts the next run at
    once (and is cleared by it)."""

    def pause() -> Awaitable[object]:
        return stop.wait() if wake is None else wait_any(stop, wake)

    if first_after:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pause(), interval)
    while not stop.is_set():
        if wake is not None:
            wake.clear()
        try:
            await run_once()
        except Exception:
            log.exception(
                "%s failed; the next run retries", getattr(run_once, "__qualname__", "periodic run")
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pause(), interval)


async def wait_any(*events: asyncio.Event) -> None:
    """Waits until one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _main(name: str, serve: Serve) -> int:
    stop = Lifetime()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with AsyncExitStack() as stack:
            if bind := os.environ.get("HM_METRICS_BIND", "").strip():
                try:
                    _port, stop_metrics = metrics.serve(bind)
                except (ValueError, OSError) as exc:
                    print(f"{name}: HM_METRICS_BIND: cannot serve metrics: {exc}", file=sys.stderr)
                    return EXIT_CONFIG
                stack.callback(stop_metrics)
            starting = asyncio.ensure_future(serve(stack, stop))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait(
                [starting, stopped], timeout=STARTUP_TIMEOUT_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if not starting.done():
                # A signal during start-up, or dependencies that never answered: give up cleanly.
                starting.cancel()
                stopped.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting
                if stop.is_set():
                    log.info("%s stopped during start-up", name)
                    return EXIT_OK
                print(
                    f"{name}: dependencies not reachable within {STARTUP_TIMEOUT_SECONDS:.0f}s",
                    file=sys.stderr,
                )
                return EXIT_UNAVAILABLE
            try:
                starting.result()
            except ExitWith as exc:
                stopped.cancel()
                log.error("%s", exc)
                print(f"{name}: {exc}", file=sys.stderr)
                return exc.code
            except (TimeoutError, OSError, ConnectionError) as exc:
                stopped.cancel()
                log.error("dependency unreachable at start: %s", type(exc).__name__)
                print(f"{name}: a dependency is unreachable: {type(exc).__name__}: {exc}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            log.info("%s serving", name)
            await stopped
            log.info("%s stopping", name)
    except ConfigError:
        raise
    except Exception as exc:
        log.exception("%s failed", name)
        if db.pooler_mismatch(exc):  # a setting, not a bug: exit 78 and say which
            print(f"{name}: {db.POOLER_HINT}", file=sys.stderr)
            return EXIT_CONFIG
        return EXIT_SOFTWARE
    if stop.failure:
        log.error("%s stopped after a failure: %s", name, stop.failure)
        if stop.code == EXIT_CONFIG:
            print(f"{name}: {stop.failure}", file=sys.stderr)
        return stop.code
    log.info("%s stopped", name)
    return EXIT_OK


def run_service(name: str, serve: Serve) -> None:
    """Run ``serve`` as service ``name`` and exit with the documented code. With
    ``HM_METRICS_BIND`` (``host:port``) set, the service's Prometheus metrics are served there
    (:func:`hypermedia.core.metrics.serve`) from before it starts until it has stopped; a bind
    that fails is exit 78."""
    telemetry.setup(name, os.environ.get("HM_LOG_LEVEL", "INFO"))
    try:
        code = asyncio.run(_main(name, serve))
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    telemetry.shutdown()  # the spans of the last moments, still in an exporter's batch
    sys.exit(code)


@dataclass(frozen=True)
class Peers:
    """gRPC channels and stubs of the storage and credits services."""

    storage_channel: grpc.aio.Channel
    credits_channel: grpc.aio.Channel
    storage: storage_pb2_grpc.StorageServiceStub
    credits: credits_pb2_grpc.CreditsServiceStub


async def open_postgres(stack: AsyncExitStack, infra: InfraSettings, *, max_size: int) -> asyncpg.Pool:
    """The service's asyncpg pool, closed when ``stack`` unwinds."""
    pool = await db.create_pool(
        infra.database_url.get_secret_value(), max_size=max_size, pooler=infra.database_pooler
    )
    stack.push_async_callback(pool.close)
    return pool


def open_peers(stack: AsyncExitStack, infra: InfraSettings, tls: Tls | None = None) -> Peers:
    """Channels to storage and credits (closed when ``stack`` unwinds) and their stubs; mutual TLS
    with ``tls`` (the certificates must name ``storage`` / ``credits``), plaintext without."""
    storage_channel = rpc.channel(infra.storage_addr, tls, "storage")
    credits_channel = rpc.channel(infra.credits_addr, tls, "credits")
    stack.push_async_callback(storage_channel.close)
    stack.push_async_callback(credits_channel.close)
    return Peers(
        storage_channel,
        credits_channel,
        storage_pb2_grpc.StorageServiceStub(storage_channel),
        credits_pb2_grpc.CreditsServiceStub(credits_channel),
    )
