"""The one way a service process runs: configure telemetry, wire dependencies in an
``AsyncExitStack``, serve until SIGTERM/SIGINT, then unwind in reverse order.

Exit codes (documented in docs/operations.md):

====  =====================================================================
0     stopped on a signal after a clean shutdown
69    a dependency (Postgres, NATS, a peer service) was unreachable at start (EX_UNAVAILABLE)
70    an unexpected internal error (EX_SOFTWARE)
78    invalid configuration; the message names each variable, never a value (EX_CONFIG)
====  =====================================================================
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from hypermedia import telemetry
from hypermedia.config import ConfigError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_UNAVAILABLE = 69
EXIT_SOFTWARE = 70
EXIT_CONFIG = 78

Serve = Callable[[AsyncExitStack, asyncio.Event], Awaitable[Any]]


async def _main(name: str, serve: Serve) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with AsyncExitStack() as stack:
            try:
                await serve(stack, stop)
            except (TimeoutError, OSError, ConnectionError) as exc:
                log.error("dependency unreachable at start: %s", type(exc).__name__)
                print(f"{name}: a dependency is unreachable: {type(exc).__name__}: {exc}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            log.info("%s serving", name)
            await stop.wait()
            log.info("%s stopping", name)
    except ConfigError:
        raise
    except Exception:
        log.exception("%s failed", name)
        return EXIT_SOFTWARE
    log.info("%s stopped", name)
    return EXIT_OK


def run_service(name: str, serve: Serve) -> None:
    """Run ``serve`` as service ``name`` and exit with the documented code."""
    import os

    telemetry.setup(name, os.environ.get("HM_LOG_LEVEL", "INFO"))
    try:
        code = asyncio.run(_main(name, serve))
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    sys.exit(code)
