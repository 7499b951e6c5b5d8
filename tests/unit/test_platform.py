"""The supervisor of ``hypermedia up`` restarting real processes that die."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from hypermedia.devtools import embedded, platform
from hypermedia.devtools.platform import Platform, ServiceProcess


def _crashing(tmp_path: Path) -> tuple[Platform, ServiceProcess]:
    """A platform supervising one process that dies at once (its module does not exist)."""
    plat = Platform(tmp_path, services=())
    proc = ServiceProcess(
        "broken", "does_not_exist", dict(os.environ), tmp_path / "broken.log", tmp_path / "broken.pid"
    )
    plat.procs.append(proc)
    proc.start()
    return plat, proc


def _supervise(plat: Platform, seconds: float) -> list[float]:
    """Run the supervisor for ``seconds``; returns the times (s from now) of each restart."""
    started = time.monotonic()
    restarts = []
    while time.monotonic() - started < seconds:
        if plat.supervise_once():
            restarts.append(time.monotonic() - started)
        time.sleep(0.05)
    return restarts


def test_a_process_dying_at_start_is_restarted_with_doubling_delays_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(platform, "CRASH_LOOP_RESTARTS", 3)
    plat, proc = _crashing(tmp_path)
    with caplog.at_level(logging.WARNING, logger="hypermedia.devtools.platform"):
        restarts = _supervise(plat, 7.8)
    gaps = [b - a for a, b in zip([0.0, *restarts], restarts, strict=False)]
    # Deaths come ~0.1 s after each start; the waits are 1, 2, 4 s.
    assert len(restarts) == 3, restarts
    assert [round(g) for g in gaps[1:]] == [2, 4], gaps
    assert proc.process is not None and int(proc.pid_path.read_text()) == proc.process.pid
    messages = [r.getMessage() for r in caplog.records]
    assert any("service broken exited with code 1; restarting in 1s" in m for m in messages), messages
    errors = [m for m, r in zip(messages, caplog.records, strict=True) if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "(crash-looping: 3 exits within 60s" in errors[0], messages
    assert "No module named services.does_not_exist" in proc.log_path.read_text()


def test_a_process_that_had_started_fine_is_restarted_after_the_shortest_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(platform, "STABLE_SECONDS", 0.0)  # every run counts as a good start
    plat, _proc = _crashing(tmp_path)
    restarts = _supervise(plat, 4.6)
    gaps = [b - a for a, b in zip([0.0, *restarts], restarts, strict=False)]
    assert len(restarts) >= 3 and all(g < 1.6 for g in gaps), gaps


def test_scale_is_only_for_worker_services(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gateway cannot be scaled"):
        Platform(tmp_path, scale={"gateway": 2})
    with pytest.raises(ValueError, match=r"must be 1\.\.16"):
        Platform(tmp_path, scale={"imageworker": 0})


def test_free_ports_lie_below_the_ephemeral_range_so_outgoing_connections_cannot_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = embedded.ephemeral_port_range()
    assert 1024 <= low < high <= 65535
    picked = [embedded.free_port() for _ in range(2000)]
    ports = set(picked)
    assert all(embedded.LISTEN_PORTS_FROM <= port < low for port in ports), ports
    # Never one port twice in a process: with ~25 random picks a platform start, two services got
    # the same port once in about a hundred starts (2,000 picks would repeat one almost surely).
    assert len(ports) == len(picked)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # each was free

    # A range leaving too few ports below it: the kernel's choice (bind 0) is the fallback.
    wide = tmp_path / "ip_local_port_range"
    wide.write_text("10500\t65000\n")
    monkeypatch.setattr(embedded, "EPHEMERAL_RANGE_FILE", wide)
    assert embedded.ephemeral_port_range() == (10500, 65000)
    assert 10500 <= embedded.free_port() <= 65000


def test_a_service_exiting_at_start_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    plat, proc = _crashing(tmp_path)
    with pytest.raises(RuntimeError) as raised:
        plat._wait_port(proc, embedded.free_port(), timeout=30)
    message = str(raised.value)
    assert message.startswith("service broken exited with code 1 at start; see ")
    assert "No module named" in message and "does_not_exist" in message, message


def test_a_worker_unit_that_exits_for_its_configuration_is_not_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real unit control with a DSN of the wrong form exits 78; restarting cannot fix that."""
    plat = Platform(tmp_path, services=())
    env = dict(os.environ) | {"HM_DATABASE_URL": "mysql://u:hidden@db/x", "HM_UNIT_NAME": "imageworker"}
    proc = ServiceProcess(
        "imageworker", "imageworker", env, tmp_path / "w.log", tmp_path / "w.pid", unit=True
    )
    plat.procs.append(proc)
    proc.start()
    assert proc.process is not None and proc.process.wait(30) == 78
    with caplog.at_level(logging.WARNING, logger="hypermedia.devtools.platform"):
        restarts = _supervise(plat, 2.5)
    assert restarts == [] and proc.given_up
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "exited with code 78 (configuration" in said[0] and "not restarted" in said[0]
    assert "not restarted" in capsys.readouterr().err
    assert "HM_DATABASE_URL" in proc.log_path.read_text() and "hidden" not in proc.log_path.read_text()


def test_a_unit_whose_lease_is_held_is_restarted_only_after_the_lease_has_expired(tmp_path: Path) -> None:
    proc = ServiceProcess("imageworker", "imageworker", {}, tmp_path / "w.log", tmp_path / "w.pid", unit=True)
    delay, level, message = platform.reconcile(proc, 75, lease_seconds=15.0)
    assert delay == 16.0 and level == logging.WARNING
    assert "deployment lease is held or was lost" in message
    other, _, _ = platform.reconcile(proc, 70, lease_seconds=15.0)
    assert other is not None and other <= 2


def test_the_scheduler_runs_last_on_the_state_directory_with_valid_default_pools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hypermedia.core import config
    from services.scheduler.settings import SchedulerSettings

    plat = Platform(tmp_path, services=("scheduler", "reaper", "credits", "imageworker"))
    assert plat.services == ("credits", "imageworker", "reaper", "scheduler"), "starts last, stops first"
    env = plat._scheduler_env({}, {"imageworker": {}}, 61064)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = config.load(SchedulerSettings)
    [pool] = settings.pools
    assert (pool.name, pool.queues, pool.provider, pool.max_workers) == (
        "images-local",
        ("images",),
        "local",
        3,
    )
    assert settings.local_dir == str(tmp_path / "scheduler") and settings.local_log_dir == str(
        tmp_path / "logs"
    )
    assert (settings.local_uid_base, settings.local_tls_dir, settings.local_stop_on_exit) == (
        61064,
        str(tmp_path / "tls"),
        True,
    )
    mine = plat._scheduler_env({"HM_SCHEDULER_POOLS": '[{"name": "ocr", "queues": ["ocr"]}]'}, {}, 1)
    assert (
        mine["HM_SCHEDULER_POOLS"] == '[{"name": "ocr", "queues": ["ocr"]}]'
        and mine["HM_SCHEDULER_LOCAL_TLS_DIR"] == ""
    )


class _Recording(ServiceProcess):
    """A process that appends ``term NAME`` to ``journal`` on SIGTERM, sleeps a while (a drain),
    then appends ``exit NAME`` and exits."""

    journal: Path = Path()

    def command(self) -> list[str]:
        script = (
            "import signal, sys, time\n"
            "def stop(*_):\n"
            f"    with open({str(self.journal)!r}, 'a') as f: f.write('term {self.name}\\n')\n"
            "    time.sleep(0.3)\n"
            f"    with open({str(self.journal)!r}, 'a') as f: f.write('exit {self.name}\\n')\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            f"open({str(self.journal)!r} + '.{self.name}', 'w').close()\n"
            "while True: time.sleep(1)\n"
        )
        return [sys.executable, "-c", script]


def test_workers_drain_together_while_gateway_storage_and_credits_still_answer(tmp_path: Path) -> None:
    """``Platform.stop``: every worker unit and the reaper get SIGTERM at once; the gateway only
    once they have exited, then storage, then credits."""
    journal = tmp_path / "journal"
    plat = Platform(tmp_path, services=())
    for name in ("credits", "storage", "gateway", "imageworker", "docworker", "reaper"):
        proc = _Recording(name, name, dict(os.environ), tmp_path / f"{name}.log", tmp_path / f"{name}.pid")
        proc.journal = journal
        proc.start()
        plat.procs.append(proc)
    for name in ("credits", "storage", "gateway", "imageworker", "docworker", "reaper"):
        deadline = time.monotonic() + 30
        while not (tmp_path / f"journal.{name}").exists():  # its handler is installed
            assert time.monotonic() < deadline, f"{name} did not start"
            time.sleep(0.02)
    plat.stop()
    lines = journal.read_text().splitlines()
    workers = {"imageworker", "docworker", "reaper"}
    assert {line.split()[1] for line in lines[:3]} == workers and all(
        line.startswith("term") for line in lines[:3]
    ), lines
    assert {line.split()[1] for line in lines[3:6]} == workers, lines
    assert lines[6:] == [
        "term gateway",
        "exit gateway",
        "term storage",
        "exit storage",
        "term credits",
        "exit credits",
    ]
