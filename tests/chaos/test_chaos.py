"""The chaos run at N = 200 (``make chaos`` runs N = 1,000): every promise of the job lifecycle
checked while imageworkers, the outbox relay, NATS and Postgres are killed or restarted. See
:mod:`tests.chaos.harness` for what is injected and what is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import Chaos

JOBS = 200


@pytest.mark.timeout(900)
def test_every_job_completes_once_and_the_ledger_balances_under_faults(tmp_root: Path) -> None:
    workdir = tmp_root / "chaos"
    workdir.mkdir()
    workdir.chmod(0o755)
    report = Chaos(workdir, JOBS, seed=7).run()
    print("\n".join(report.lines()))
    assert report.faults["worker_kill"] >= 3
    assert {"gateway_kill", "nats_restart", "postgres_restart"} <= set(report.faults)
    assert report.submitted == JOBS
    assert report.statuses == {"completed": JOBS}
    assert report.lost == 0
    assert (report.outputs_not_one, report.charges_not_one) == (0, 0)
    assert report.granted - report.charged == report.balance
    assert (report.held, report.holds_open) == (0, 0)
    assert report.outputs_checked == JOBS and report.outputs_different == 0
    assert report.job_dirs_left == 0
    assert report.passed, report.problems
