"""``python -m services.scheduler``: burst workers by demand (issue 20, ADR 0047). Every
``HM_SCHEDULER_INTERVAL_SECONDS`` it tries to be the leader (:class:`Leadership`); the leader runs
:meth:`Scheduler.run_once`, a standby waits. Only wires."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from contextlib import AsyncExitStack
from pathlib import Path

from hypermedia.api.keda import externalscaler_pb2_grpc as keda_grpc
from hypermedia.core import config
from hypermedia.infra import rpc
from hypermedia.infra.service import Lifetime, every, open_postgres, run_service
from services.scheduler import keda
from services.scheduler.keda import ExternalScaler
from services.scheduler.leader import Leadership
from services.scheduler.providers import Provider
from services.scheduler.providers.ec2 import Ec2Provider
from services.scheduler.providers.local import LocalProvider
from services.scheduler.scheduler import Scheduler, Timing
from services.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


def _local_provider(settings: SchedulerSettings) -> LocalProvider:
    local_dir = Path(settings.local_dir).resolve()
    return LocalProvider(
        local_dir,
        Path(settings.local_log_dir).resolve() if settings.local_log_dir else local_dir / "logs",
        settings.local_uid_base,
        sum(pool.max_workers for pool in settings.pools if pool.provider == "local"),
        Path(settings.local_tls_dir) if settings.local_tls_dir else None,
        stop_on_close=settings.local_stop_on_exit,
    )


async def open_providers(settings: SchedulerSettings) -> dict[str, Provider]:
    """One provider per name the pools use. Raises the clients' configuration errors (no AWS
    region, no kubeconfig or in-cluster service account)."""
    pools = settings.pools
    providers: dict[str, Provider] = {}
    if any(pool.provider == "local" for pool in pools):
        providers["local"] = _local_provider(settings)
    if any(pool.provider == "ec2" for pool in pools):
        import boto3

        client = boto3.client(
            "ec2", region_name=settings.ec2_region or None, endpoint_url=settings.ec2_endpoint_url or None
        )
        providers["ec2"] = Ec2Provider(client)
    if any(pool.provider == "kubernetes" for pool in pools):
        from services.scheduler.providers import kubernetes

        try:
            api = await kubernetes.open_client(settings.kubeconfig, settings.kube_context)
        except (kubernetes.ConfigException, OSError) as exc:
            where = (
                "the kubeconfig" if settings.kubeconfig else "the in-cluster service account (no kubeconfig)"
            )
            raise config.ConfigError(
                f"HM_SCHEDULER_KUBECONFIG: the kubernetes pools' cluster cannot be reached: {where} "
                f"cannot be loaded: {exc}"
            ) from None
        providers["kubernetes"] = kubernetes.KubernetesProvider(api)
    return providers


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    infra = config.load(config.InfraSettings)
    settings = config.load(SchedulerSettings)
    holder = f"{socket.gethostname()}/{os.getpid()}"
    leadership = Leadership(infra.session_url, holder)
    stack.push_async_callback(leadership.release)
    providers = await open_providers(settings)
    for provider in providers.values():
        stack.push_async_callback(provider.close)
    scheduler = Scheduler(
        settings.pools,
        providers,
        holder,
        Timing(settings.arrival_window_seconds, settings.stale_seconds, settings.drain_timeout_seconds),
    )
    log.info(
        "scheduler %s: %d pools, a cycle every %gs", holder, len(scheduler.pools), settings.interval_seconds
    )

    async def cycle() -> None:
        if await leadership.hold():
            try:
                await scheduler.run_once(leadership.conn)
            except Exception:
                await leadership.release()  # a half-done cycle: the next leader starts clean
                raise

    if settings.keda_bind:
        pool = await open_postgres(stack, infra, max_size=2)
        scaler = rpc.GrpcServer(
            settings.keda_bind,
            [
                (
                    keda_grpc.add_ExternalScalerServicer_to_server,
                    ExternalScaler(
                        pool,
                        arrival_window_seconds=settings.arrival_window_seconds,
                        stream_seconds=settings.interval_seconds,
                    ),
                )
            ],
            [keda.SERVICE_NAME],
        )
        await scaler.start()
        stack.push_async_callback(scaler.stop)
        log.info("KEDA external scaler on %s", settings.keda_bind)

    inner_stop = asyncio.Event()
    task = asyncio.create_task(every(settings.interval_seconds, cycle, inner_stop, wake=leadership.wake))

    async def finish() -> None:
        inner_stop.set()
        await task

    stack.push_async_callback(finish)


if __name__ == "__main__":
    run_service("scheduler", serve)
