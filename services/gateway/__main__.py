"""``python -m services.gateway``: REST (uvicorn) and gRPC JobService, plus the outbox relay.
Only wires; the use cases are one module each (uploads, creation, status, cancellation, accounts)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from contextlib import AsyncExitStack
from functools import partial

import httpx

from hypermedia.api.jobs.v1 import backfill_pb2_grpc, jobs_pb2_grpc, schedules_pb2_grpc
from hypermedia.api.scheduler.v1 import scheduler_pb2_grpc
from hypermedia.core import config
from hypermedia.infra import mtls, rpc
from hypermedia.infra.httplimits import HttpSettings
from hypermedia.infra.httpserver import HttpServer
from hypermedia.infra.service import Lifetime, every, open_peers, open_postgres, run_service
from hypermedia.intake import clamav
from hypermedia.jobs import accounts as auth
from hypermedia.jobs import queues
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.events import JobEventHub
from hypermedia.jobs.outbox import OutboxRelay
from hypermedia.jobs.settlement import Settlement
from services.gateway import backfills_grpc, dashboard, operators_api, schedules_grpc
from services.gateway.accounts import Accounts
from services.gateway.backfill_runner import BackfillRunner
from services.gateway.backfills import Backfills
from services.gateway.cancellation import JobCancellation
from services.gateway.catalogue import OperationCatalogue
from services.gateway.creation import JobCreation
from services.gateway.grpc_api import JobService
from services.gateway.operators import SchedulerAdmin
from services.gateway.presets import Presets
from services.gateway.resolved import LinkSigner, OutputResolver
from services.gateway.rest import HEALTH_PATHS, build_app
from services.gateway.schedule_runner import ScheduleRunner
from services.gateway.schedules import Schedules
from services.gateway.settings import GatewaySettings
from services.gateway.status import JobStatus
from services.gateway.uploads import Uploads
from services.gateway.usecases import UseCases

log = logging.getLogger(__name__)


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    infra = config.load(config.InfraSettings)
    settings = config.load(GatewaySettings)
    http_limits = config.load(HttpSettings)
    pool = await open_postgres(stack, infra, max_size=20)
    nc, js = await queues.open_jetstream(stack, infra, "gateway")
    peers = open_peers(stack, infra, mtls.from_environment())
    http = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0))
    stack.push_async_callback(http.aclose)

    relay = OutboxRelay(pool, nc, js, listen_dsn=infra.separate_session_url)
    relay_stop = asyncio.Event()
    relay_task = asyncio.create_task(relay.run(relay_stop, settings.relay_poll_seconds))

    async def stop_relay() -> None:
        relay_stop.set()
        await relay_task

    stack.push_async_callback(stop_relay)

    events = JobEventHub(pool, infra.session_url)
    await events.start()
    stack.push_async_callback(events.stop)

    scanner: clamav.ClamdScanner | None = None
    if settings.clamd_url:
        scanner = clamav.ClamdScanner(
            clamav.ClamdAddress.parse(settings.clamd_url),
            timeout_seconds=settings.clamd_timeout_seconds,
            max_stream_bytes=settings.clamd_max_stream_bytes,
        )

    secret_key = settings.secret_key.get_secret_value()
    if not secret_key:
        log.warning(
            "HM_GATEWAY_SECRET_KEY is unset: requests with a document password are refused,"
            " and playlists that link other playlists cannot be resolved"
        )

    settlement = Settlement(peers.credits)
    status = JobStatus(pool, peers.storage, events)
    creation = JobCreation(
        pool,
        peers.storage,
        peers.credits,
        settlement,
        relay,
        stream_prefix=infra.stream_prefix,
        max_operations=settings.max_operations,
        password_key=jobsecrets.derive_key(secret_key) if secret_key else None,
        webhook_allow_private=settings.webhook_allow_private,
        noop_enabled=settings.noop_operation,
    )
    accounts = Accounts(pool, peers.credits)
    backfills = Backfills(pool, creation, accounts, settlement)
    runner = BackfillRunner(
        pool,
        creation,
        settlement,
        owner=f"gateway/{socket.gethostname()}/{os.getpid()}",
        brake_targets=settings.brake_targets,
    )
    schedule_runner = ScheduleRunner(
        pool, creation, backfills, runner=f"gateway/{socket.gethostname()}/{os.getpid()}"
    )
    runner_stop = asyncio.Event()
    runner_tasks = [
        asyncio.create_task(every(settings.backfill_poll_seconds, runner.run_once, runner_stop)),
        asyncio.create_task(every(settings.schedule_poll_seconds, schedule_runner.run_once, runner_stop)),
    ]

    async def stop_runner() -> None:
        runner_stop.set()
        await asyncio.gather(*runner_tasks)

    stack.push_async_callback(stop_runner)
    api = UseCases(
        uploads=Uploads(peers.storage, http, max_upload_bytes=settings.max_upload_bytes, scanner=scanner),
        creation=creation,
        status=status,
        cancellation=JobCancellation(pool, settlement, status),
        accounts=accounts,
        operators=SchedulerAdmin(pool),
        presets=Presets(pool, creation),
        backfills=backfills,
        schedules=Schedules(pool, creation, backfills),
        catalogue=OperationCatalogue(pool, settings.noop_operation),
    )
    resolver = OutputResolver(
        pool, peers.storage, http, LinkSigner.from_secret(secret_key) if secret_key else None
    )
    authenticate = partial(auth.authenticate, pool)

    async def readiness() -> dict[str, bool]:
        checks = {"postgres": False, "nats": nc.is_connected, "credits": False, "storage": False}
        try:
            checks["postgres"] = await pool.fetchval("SELECT 1") == 1
        except Exception:
            pass
        for name, chan in (("credits", peers.credits_channel), ("storage", peers.storage_channel)):
            checks[name] = await rpc.healthy(chan)
        if scanner is not None:
            checks["clamd"] = await scanner.ping()
        return checks

    grpc_server = rpc.GrpcServer(
        f"{settings.grpc_host}:{settings.grpc_port}",
        [
            (jobs_pb2_grpc.add_JobServiceServicer_to_server, JobService(api, authenticate)),
            (
                backfill_pb2_grpc.add_BackfillServiceServicer_to_server,
                backfills_grpc.BackfillService(api.backfills, authenticate),
            ),
            (
                schedules_pb2_grpc.add_ScheduleServiceServicer_to_server,
                schedules_grpc.ScheduleService(api.schedules, authenticate),
            ),
            (
                scheduler_pb2_grpc.add_SchedulerAdminServiceServicer_to_server,
                operators_api.SchedulerAdminService(api.operators, authenticate),
            ),
        ],
        [
            "hypermedia.jobs.v1.JobService",
            backfills_grpc.SERVICE_NAME,
            schedules_grpc.SERVICE_NAME,
            operators_api.SERVICE_NAME,
        ],
    )
    await grpc_server.start()
    stack.push_async_callback(grpc_server.stop)

    http_server = HttpServer(
        settings.http_host, settings.http_port, limits=http_limits, reserve_paths=HEALTH_PATHS
    )
    await http_server.start(
        build_app(
            api,
            authenticate,
            readiness,
            resolver,
            settings.max_concurrent_uploads_per_account,
            pages=dashboard.router(
                api, pool, authenticate, dashboard.Sessions.from_secret(secret_key), resolver
            ),
        )
    )
    stack.push_async_callback(http_server.stop)


if __name__ == "__main__":
    run_service("gateway", serve)
