"""A worker unit's control: the container's PID 1 (seed 001, ADR 0046).

Shape::

    validate the configuration ─▶ deployment lease (epoch) ─▶ private socket ─▶ launch execution g0
        (exit 78, nothing launched)   (exit 75 when held)                       in its own cgroup
    execution: hello ─▶ evidence ─▶ ready (within 30 s, else exit 69)
    every HM_UNIT_SAMPLE_SECONDS: sample execution's cgroup + backlog ─▶ autoscaler ─▶ admission
    every lease/3: renew (lost ─▶ contain, exit 75)
    execution died ─▶ contain (SIGKILL every process of it; reap) ─▶ hand its jobs back ─▶ g+1
    SIGTERM ─▶ SIGTERM to execution (its drain, 35 s) ─▶ contain what is left ─▶ release ─▶ exit 0

Control runs no business work and no native library. It is a child subreaper
(``PR_SET_CHILD_SUBREAPER``, prctl(2)), so a process of execution whose parent died is re-parented
to control, never to the host's init: containment finds every one of them as control's
descendants (and in execution's cgroup, where there is one), SIGKILLs them and reaps them; a job
is handed back only after that, so no process of a contained execution can still write.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import asyncpg

from hypermedia.core import config, telemetry
from hypermedia.infra import db
from hypermedia.infra.service import (
    EXIT_CONFIG,
    EXIT_CONTAINMENT,
    EXIT_LEASE,
    EXIT_OK,
    EXIT_SOFTWARE,
    EXIT_UNAVAILABLE,
    STARTUP_TIMEOUT_SECONDS,
)
from hypermedia.jobs import lifecycle, queues
from hypermedia.sandbox import cgroups
from hypermedia.sandbox.cgroupfind import Unavailable
from hypermedia.worker import registry
from hypermedia.worker.unit import containment, evidence, lease, peer, routing
from hypermedia.worker.unit.autoscaler import Autoscaler, SharedRoom
from hypermedia.worker.unit.channel import Channel, Execution, remove_stale_socket_dirs
from hypermedia.worker.unit.coordinator import MediaCoordinator
from hypermedia.worker.unit.settings import QUEUES_VARIABLE, ROLES, Configuration, lanes_spec, validate

log = logging.getLogger(__name__)

RELAUNCHES_PER_WINDOW = 5
RELAUNCH_WINDOW_SECONDS = 300.0
"""More relaunches than this within the window end the unit (exit 70): an execution that keeps
dying is a fault for the host controller, not for control to hide."""

RELAUNCH_BACKOFF_SECONDS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Wait before the n-th relaunch within the window (the first at once): a crash loop is slowed
before it ends the unit."""

STOP_GRACE_SECONDS = 10.0
"""What control adds to execution's drain (``HM_DRAIN_SECONDS``) before it kills what is left."""

PR_SET_CHILD_SUBREAPER = 36


class UnitEnded(Exception):
    """The unit ends with ``code`` (one of the exit codes of :mod:`hypermedia.infra.service`)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Control:
    """The control process of one unit. :meth:`run` returns the exit code."""

    def __init__(self, cfg: Configuration) -> None:
        self.cfg = cfg
        self.boot = cfg.unit.boot or uuid.uuid4().hex
        self.deployment = cfg.worker.deployment
        self.pool: asyncpg.Pool | None = None
        self.lease: lease.Lease | None = None
        self.generation = 0
        self.execution: Execution | None = None
        self.cgroups: cgroups.Cgroups | None = None
        self.autoscalers = {lane.worker.queue: Autoscaler(lane.worker.slots, 512) for lane in cfg.lanes}
        """One per queue of the unit, deciding together (:class:`SharedRoom`)."""
        self.room = SharedRoom()
        self.coordinator = MediaCoordinator(cfg.coordinator_bounds) if cfg.coordinator_bounds else None
        self.channel = Channel(self.identity, lambda: self.execution, self._evidence, self.coordinator)
        self._relaunches: list[float] = []
        self._socket_dir = ""
        self.socket_path = ""
        self._stop = asyncio.Event()
        self._renewing: asyncio.Task[None] | None = None
        self._last_reason_kind: dict[str, str] = {}
        self.measured: cgroups.JobCgroup | None = None
        """The group read for evidence when execution has none of its own: control's (read only)."""

    # -- start -------------------------------------------------------------------------------

    async def run(self) -> int:
        """Start, supervise, stop; the exit code. See the module docstring."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        server: asyncio.AbstractServer | None = None
        try:
            try:
                await asyncio.wait_for(self._open(), STARTUP_TIMEOUT_SECONDS)
            except (TimeoutError, OSError, ConnectionError) as exc:
                raise UnitEnded(EXIT_UNAVAILABLE, f"Postgres not reachable: {type(exc).__name__}") from None
            server = await asyncio.start_unix_server(
                self.channel.serve, self.socket_path, limit=peer.MAX_MESSAGE_BYTES
            )
            if self._stop.is_set():
                raise UnitEnded(EXIT_OK, "stopped before execution was launched")
            self._launch()
            return await self._supervise()
        except UnitEnded as ended:
            (log.info if ended.code == EXIT_OK else log.error)("unit %s ends: %s", self.cfg.unit_name, ended)
            print(f"{self._name()}: {ended}", file=sys.stderr, flush=True)
            return ended.code
        except Exception:
            log.exception("control failed")
            return EXIT_SOFTWARE
        finally:
            await self._finish(server)

    def _name(self) -> str:
        return f"{self.cfg.name}-control"

    async def _open(self) -> None:
        infra = self.cfg.infra
        self.pool = await db.create_pool(
            infra.database_url.get_secret_value(), max_size=3, pooler=infra.database_pooler
        )
        try:
            self.lease = await lease.acquire(
                self.pool,
                self.deployment,
                self.cfg.unit_name,
                boot_id=self.boot,
                holder=f"{socket.gethostname()}/{os.getpid()}",
                ttl_seconds=self.cfg.unit.lease_seconds,
            )
        except lease.LeaseHeld as exc:
            raise UnitEnded(EXIT_LEASE, str(exc)) from None
        # Renewal counts from the taking, not from the end of the start (which can take seconds).
        self._renewing = asyncio.create_task(self._renew_loop())
        log.info(
            "deployment lease taken: unit %s epoch %d boot %s",
            self.cfg.unit_name,
            self.lease.epoch,
            self.boot[:8],
            extra={"unit": self.cfg.unit_name, "epoch": self.lease.epoch},
        )
        problems = []
        for lane in self.cfg.lanes:
            problems += await routing.routing_problems(
                self.pool,
                queues.engine_of(lane.worker.queue),  # a bulk lane runs its engine's profiles
                routing.handled_operations(lane.role.operations),
                lane.role.name,
            )
        if problems:
            raise UnitEnded(
                EXIT_CONFIG, "the work routed to this unit is invalid:\n  " + "\n  ".join(problems)
            )
        for lane in self.cfg.lanes:
            # A bulk lane's jobs are its engine's operations: the engine's attempts count too.
            routes = sorted({lane.worker.queue, queues.engine_of(lane.worker.queue)})
            job_mb, source = await evidence.job_memory_mb(self.pool, routes)
            self.autoscalers[lane.worker.queue] = Autoscaler(lane.worker.slots, job_mb, source)
        opened = cgroups.open_cgroups(self.cfg.unit.cgroup, variable="HM_UNIT_CGROUP")
        if isinstance(opened, Unavailable):
            self.measured = evidence.own_group() if self.cfg.unit.cgroup != "off" else None
            log.warning(
                "execution runs without a cgroup of its own (%s); %s",
                opened.reason,
                "admission is measured on the container's own cgroup, read only"
                if self.measured is not None
                else "no measurements: admission holds at one",
            )
        else:
            self.cgroups = opened
            log.info("execution's cgroup: %s", opened.describe())
        with contextlib.suppress(OSError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        run_dir = self.cfg.unit.run_dir or os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
        remove_stale_socket_dirs(run_dir)
        self._socket_dir = tempfile.mkdtemp(prefix=f"hm-unit-{os.getpid()}-", dir=run_dir)  # mode 0700
        self.socket_path = os.path.join(self._socket_dir, "control.sock")

    # -- execution ---------------------------------------------------------------------------

    def identity(self) -> peer.UnitIdentity:
        assert self.lease is not None
        return peer.UnitIdentity(
            self.deployment, self.cfg.unit_name, self.boot, self.lease.epoch, self.generation
        )

    def _evidence(self) -> dict[str, Any]:
        return {
            "lease_expires_at": self.lease.expires_at.isoformat() if self.lease else "",
            "coordinator": self.cfg.coordinator_bounds,
        }

    def _launch(self) -> None:
        """Launch execution (``python -m services.{role}``, or ``services.multiworker`` with
        ``HM_WORKER_QUEUES`` for a unit of ``--queues``) at the current generation, in its own
        cgroup when there is one (a shell writes its pid to the group's ``cgroup.procs`` and then
        execs Python, so nothing of execution ever runs outside it)."""
        identity = self.identity()
        group = None
        if self.cgroups is not None:
            group = self.cgroups.create(
                f"execution-{self.boot[:8]}-g{self.generation}",
                self.cfg.unit.memory_mb * 1024 * 1024 if self.cfg.unit.memory_mb else cgroups_unlimited(),
                self.cfg.unit.pids_max or 4_194_304,
            )
        procs = list(group.procs_files) if group is not None else []
        script = (
            'for f in "$@"; do echo 0 > "$f" || exit 71; done; exec "$HM_UNIT_PYTHON" -m "$HM_UNIT_MODULE"'
        )
        env = {
            **os.environ,
            **identity.env(self.socket_path),
            "HM_UNIT_PYTHON": sys.executable,
            "HM_UNIT_MODULE": self.cfg.module,
        }
        if self.cfg.plans:
            env[QUEUES_VARIABLE] = lanes_spec(self.cfg.plans)
        process = subprocess.Popen(["/bin/sh", "-c", script, "sh", *procs], env=env)
        worker_ids = tuple(
            registry.worker_identity_of(self.deployment, lane.role.name, identity.generation, process.pid)
            for lane in self.cfg.lanes
        ) + tuple(  # their scheduler consumers' (ADR 0073): contained and handed back alike
            registry.worker_identity_of(
                self.deployment, lane.role.name, identity.generation, process.pid, scheduler=True
            )
            for lane in self.cfg.lanes
            if lane.worker.scheduler == "on" and lane.worker.queue in queues.ENGINE_QUEUES
        )
        self.execution = Execution(identity, process, group, time.monotonic(), worker_ids)
        log.info(
            "execution launched: generation %d pid %d",
            identity.generation,
            process.pid,
            extra={"generation": identity.generation, "worker_id": ",".join(worker_ids)},
        )

    def _reap(self) -> None:
        """SIGCHLD: reap every child that ended (execution, and any process of it re-parented to
        control, the subreaper); execution's exit status is kept."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ex = self.execution
            if ex is not None and pid == ex.process.pid:
                ex.exit_code = os.waitstatus_to_exitcode(status)
                ex.process.returncode = ex.exit_code
                ex.exited.set()

    async def _supervise(self) -> int:
        """Until a stop: wait for readiness, sample and decide, renew, relaunch after a death."""
        renewing = self._renewing
        assert renewing is not None
        sampling = asyncio.create_task(self._sample_loop())
        try:
            while True:
                ex = self.execution
                assert ex is not None
                ready = asyncio.ensure_future(ex.ready.wait())
                ended = asyncio.ensure_future(self._first(ex, renewing))
                deadline = ex.launched_at + STARTUP_TIMEOUT_SECONDS - time.monotonic()
                done, _ = await asyncio.wait(
                    {ready, ended}, timeout=max(0.0, deadline), return_when=asyncio.FIRST_COMPLETED
                )
                ready.cancel()
                if not done:
                    await self._contain(ex)
                    raise UnitEnded(
                        EXIT_UNAVAILABLE,
                        f"execution not ready within the {STARTUP_TIMEOUT_SECONDS:.0f} s startup admission deadline",
                    )
                if ended in done or not ex.ready.is_set():
                    ended.cancel()
                    await self._after_end(ex, renewing, during_start=True)
                    continue
                await ended
                await self._after_end(ex, renewing, during_start=False)
        finally:
            renewing.cancel()
            sampling.cancel()
            await asyncio.gather(renewing, sampling, return_exceptions=True)

    async def _first(self, ex: Execution, renewing: asyncio.Task[None]) -> None:
        """Until execution exits, a stop is asked, the lease is lost or a ready execution falls
        silent (``HM_UNIT_STATUS_SILENCE_SECONDS``)."""
        waiters = [
            asyncio.ensure_future(ex.exited.wait()),
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._silence(ex)),
            renewing,
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters[:3]:
                w.cancel()

    async def _silence(self, ex: Execution) -> None:
        """Return when ``ex`` is ready and its last status is older than
        ``HM_UNIT_STATUS_SILENCE_SECONDS`` (:attr:`UnitSettings.status_silence_seconds`)."""
        silence = self.cfg.unit.status_silence_seconds
        while True:
            await asyncio.sleep(1.0)
            if ex.ready.is_set() and time.monotonic() - ex.status_at > silence:
                ex.silent = True
                log.error(
                    "execution generation %d sent no status for %.0f s (stopped or stuck); containing it",
                    ex.identity.generation,
                    silence,
                )
                return

    async def _after_end(self, ex: Execution, renewing: asyncio.Task[None], *, during_start: bool) -> None:
        """Execution exited, control was asked to stop, or the lease was lost: contain, then end
        the unit or launch the next generation (raises :class:`UnitEnded` to end)."""
        if renewing.done():
            await self._contain(ex)
            await self._release_jobs(ex)
            raise UnitEnded(
                EXIT_LEASE, "the deployment lease was lost: execution contained and its jobs handed back"
            )
        if self._stop.is_set() and not ex.exited.is_set():
            await self._stop_execution(ex)
            raise UnitEnded(EXIT_OK, "stopped")
        code = ex.exit_code
        await self._contain(ex)
        if self._stop.is_set():
            await self._release_jobs(ex)
            raise UnitEnded(EXIT_OK, "stopped")
        if code in (EXIT_CONFIG, EXIT_LEASE) or (during_start and code == EXIT_UNAVAILABLE):
            raise UnitEnded(code, f"execution exited {code} ({_meaning(code)}); not relaunched")
        handed = await self._release_jobs(ex)
        now = time.monotonic()
        self._relaunches = [t for t in self._relaunches if now - t < RELAUNCH_WINDOW_SECONDS] + [now]
        if len(self._relaunches) > RELAUNCHES_PER_WINDOW:
            raise UnitEnded(
                EXIT_SOFTWARE,
                f"execution died {len(self._relaunches)} times within {RELAUNCH_WINDOW_SECONDS:.0f} s; the host controller decides",
            )
        log.warning(
            "execution generation %d %s; contained, %d jobs handed back; launching generation %d",
            ex.identity.generation,
            "fell silent" if ex.silent else f"exited {code}",
            handed,
            ex.identity.generation + 1,
        )
        backoff = RELAUNCH_BACKOFF_SECONDS[min(len(self._relaunches), len(RELAUNCH_BACKOFF_SECONDS)) - 1]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), backoff)
        if self._stop.is_set():
            raise UnitEnded(EXIT_OK, "stopped")
        self.generation += 1
        self._launch()

    async def _stop_execution(self, ex: Execution) -> None:
        """SIGTERM to execution: it drains (``HM_DRAIN_SECONDS``); past that and a grace, contain."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(ex.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(ex.exited.wait(), self.cfg.worker.drain_seconds + STOP_GRACE_SECONDS)
        except TimeoutError:
            log.error(
                "execution did not stop within its drain and %.0f s more; killing it", STOP_GRACE_SECONDS
            )
        await self._contain(ex)
        await self._release_jobs(ex)

    async def _contain(self, ex: Execution) -> None:
        """:func:`containment.contain` of ``ex``.

        Raises:
            UnitEnded: (71) something of it outlived SIGKILL.
        """
        try:
            await containment.contain(ex, self._reap)
        except containment.ContainmentFailed as exc:
            raise UnitEnded(EXIT_CONTAINMENT, str(exc)) from None
        if self.coordinator is not None and (freed := self.coordinator.drop(ex.identity.generation)):
            log.info(
                "media coordinator: %d grants of generation %d freed after containment",
                freed,
                ex.identity.generation,
            )

    async def _release_jobs(self, ex: Execution) -> int:
        """Hand back the jobs of a contained execution, of each of its lanes
        (:func:`lifecycle.release_contained`)."""
        assert self.pool is not None
        released = []
        for worker_id in ex.worker_ids:
            try:
                released += await lifecycle.release_contained(
                    self.pool, self.cfg.infra.stream_prefix, worker_id
                )
            except Exception:
                log.exception(
                    "could not hand back the jobs of %s; the reaper will at lease expiry", worker_id
                )
        for job_id, status in released:
            log.info("job handed back after containment", extra={"job_id": job_id, "status": status})
        return len(released)

    # -- lease and admission -----------------------------------------------------------------

    async def _renew_loop(self) -> None:
        """Renew every third of the lease's time to live; return when it is lost (an unreachable
        Postgres until the lease ran out counts as lost)."""
        assert self.pool is not None and self.lease is not None
        ttl = self.cfg.unit.lease_seconds
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                renewed = await lease.renew(self.pool, self.lease, ttl)
            except Exception as exc:
                if not db.is_transient(exc) and not isinstance(exc, (OSError, asyncpg.PostgresError)):
                    raise
                log.warning("lease renewal failed (%s); retrying", type(exc).__name__)
                continue
            if renewed is None:
                log.error("deployment lease lost: unit %s epoch %d", self.cfg.unit_name, self.lease.epoch)
                return
            self.lease = renewed

    async def _sample_loop(self) -> None:
        """Sample execution's cgroup and the backlog, decide, tell execution; a failed round is
        logged and the next one tries again (missing samples then hold admission at one)."""
        while True:
            try:
                await self._sample_once()
            except Exception:
                log.exception("admission sampling failed; the next round retries")
            await asyncio.sleep(self.cfg.unit.sample_seconds)

    async def _sample_once(self) -> None:
        """One round of :meth:`_sample_loop` (nothing before execution is ready): one sample of
        execution's cgroup, one decision per queue over the room they share
        (:class:`SharedRoom`, the longest backlog first), an ``admission`` message
        per queue."""
        assert self.pool is not None
        ex = self.execution
        if ex is None or ex.writer is None or not ex.ready.is_set():
            return
        sample = evidence.read(ex.group or self.measured)
        routes = [lane.worker.queue for lane in self.cfg.lanes]
        try:
            backlogs = await evidence.backlogs(self.pool, routes)
        except Exception as exc:
            log.warning("backlog not read (%s); counted as empty this round", type(exc).__name__)
            backlogs = {}
        lanes = [
            (
                lane.worker.queue,
                self.autoscalers[lane.worker.queue],
                backlogs.get(lane.worker.queue, 0),
                ex.busy_on(lane.worker.queue, lane.worker.slots),
            )
            for lane in self.cfg.lanes
        ]
        lanes.sort(key=lambda lane: -lane[2])
        decisions = self.room.decide([(scaler, backlog, busy) for _, scaler, backlog, busy in lanes], sample)
        measured = dataclasses.asdict(sample) if sample is not None else None
        for (queue, scaler, backlog, _), decision in zip(lanes, decisions, strict=True):
            kind = decision.reason.split(":")[0] + f"/{decision.target}"
            if kind != self._last_reason_kind.get(queue):
                log.info(
                    "admission target %d on %s: %s",
                    decision.target,
                    queue,
                    decision.reason,
                    extra={
                        "admission_target": decision.target,
                        "queue": queue,
                        "generation": ex.identity.generation,
                    },
                )
                self._last_reason_kind[queue] = kind
            body: dict[str, Any] = {
                "queue": queue,
                "target": decision.target,
                "reason": decision.reason,
                "decided_at": decision.decided_at,
                "backlog": backlog,
                "job_memory_mb": scaler.job_memory_mb,
                "job_memory_source": scaler.memory_source,
                "refused": self.channel.refused,
            }
            if measured is not None:
                body["sample"] = measured
            with contextlib.suppress(ConnectionError, OSError):
                await peer.send(ex.writer, "admission", ex.identity, **body)

    # -- stop --------------------------------------------------------------------------------

    async def _finish(self, server: asyncio.AbstractServer | None) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        ex = self.execution
        if ex is not None and containment.unit_processes(ex):
            with contextlib.suppress(UnitEnded):
                await self._contain(ex)
        if server is not None:
            server.close()
        if self._socket_dir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self.cgroups is not None:
            self.cgroups.close()
        if self.pool is not None:
            if self.lease is not None:
                with contextlib.suppress(Exception):
                    await lease.release(self.pool, self.lease)
            await self.pool.close()


def cgroups_unlimited() -> int:
    """The largest memory limit a cgroup file takes (no limit of its own)."""
    return 2**63 - 1 - (2**63 - 1) % 4096


def _meaning(code: int | None) -> str:
    return {
        EXIT_CONFIG: "configuration",
        EXIT_LEASE: "lease lost or fenced",
        EXIT_UNAVAILABLE: "a dependency not reachable at start",
        EXIT_SOFTWARE: "internal error",
    }.get(code or 0, "killed or crashed" if code is None or code < 0 else "failure")


def main(argv: list[str] | None = None) -> None:
    """``python -m hypermedia.worker.unit (ROLE | --queues Q[=N],...) [--unit NAME]``: run
    control; exits with the code of docs/operations.md ("Exit codes")."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m hypermedia.worker.unit", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "role", nargs="?", help="the execution to launch: imageworker, docworker, ocrworker or mediaworker"
    )
    parser.add_argument(
        "--queues",
        help="instead of a role: the queues of one execution with their slots, e.g. images=4,documents=2",
    )
    parser.add_argument(
        "--unit", help="the unit's name in its deployment (default HM_UNIT_NAME, else the role)"
    )
    args = parser.parse_args(argv)
    name = args.role if args.role in ROLES else "worker"  # never echo an unchecked argument
    telemetry.setup(f"{name}-control", os.environ.get("HM_LOG_LEVEL", "INFO"))
    try:
        cfg = validate(args.role, args.unit, args.queues)
    except config.ConfigError as exc:
        print(f"{name}-control: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(asyncio.run(Control(cfg).run()))
