"""The scheduler's formula (services/scheduler/formula.py): Little's law for the target, the
one-boot-time-of-work rule, the step cap, the spend cap, stale inputs, and the choice of workers
to drain (only idle ones past their boot grace). The first case is docs/operations.md's worked
example, number for number."""

from __future__ import annotations

import re

import pydantic
import pytest

from services.scheduler.formula import BurstWorker, Inputs, QueueDemand, plan, slots_needed, target_workers
from services.scheduler.pools import Pool, parse_pools

POOL = Pool(
    name="images-spot",
    queues=("images",),
    slots_per_worker=4,
    utilisation=0.8,
    drain_target_seconds=300,
    boot_seconds=60,
    max_workers=10,
    step_max=4,
)
FLOOD = QueueDemand(
    "images", ready=3000, backlog_work_seconds=3000 * 2.0, arrival_per_second=0.5, arrival_work_rate=0.5 * 2.0
)


def registered(name: str, *, idle: float, age: float = 3600.0, running: int = 0) -> BurstWorker:
    return BurstWorker(name, "registered", age_seconds=age, running_jobs=running, idle_seconds=idle)


def test_the_worked_example_of_the_operations_page() -> None:
    inputs = Inputs(demand=(FLOOD,), standing_slots=4)
    # 1 slot of arrivals + 6000 slot-seconds of backlog / 300 s = 21 slots; the standing worker
    # covers 4 × 0.8 = 3.2 of them; 17.8 / (4 × 0.8) = 5.56 → 6 burst workers.
    assert slots_needed(POOL, inputs) == pytest.approx(21.0)
    assert target_workers(POOL, inputs) == 6
    decided = plan(POOL, inputs)
    # 6 wanted, 4 at most per step; 6000 + (1 - 3.2) × 60 = 5868 slot-seconds left after a boot
    # pay for 5868 / (3.2 × 60) = 30 workers, so the step cap decides.
    assert (decided.target, decided.action, decided.count) == (6, "start", 4)
    assert decided.reason == "target 6 > 0 live: starting 4"
    # The next cycle, with the four booting: two more.
    booting = tuple(BurstWorker(f"b{i}", "booting", age_seconds=15) for i in range(4))
    assert plan(POOL, Inputs(demand=(FLOOD,), standing_slots=4, burst=booting)).count == 2


def test_a_worker_is_started_only_for_a_boot_time_of_work() -> None:
    # 100 jobs of 2 s = 200 slot-seconds; the standing worker drains 3.2 slot-seconds a second, so
    # 200 - 3.2 × 60 = 8 are left after a 60 s boot, less than the 192 one new worker would need.
    small = QueueDemand("images", ready=100, backlog_work_seconds=200.0)
    decided = plan(
        POOL.model_copy(update={"drain_target_seconds": 30}), Inputs(demand=(small,), standing_slots=4)
    )
    assert decided.target == 2 and (decided.action, decided.count) == ("hold", 0)
    assert "8.0 slot-seconds of work would be left after one boot (60 s): enough for 0 more" in decided.reason


def test_ready_jobs_without_any_worker_get_one_whatever_the_work() -> None:
    few = QueueDemand("images", ready=3, backlog_work_seconds=0.3)
    decided = plan(POOL, Inputs(demand=(few,)))
    assert (decided.target, decided.action, decided.count) == (1, "start", 1)
    assert "no worker for 3 ready jobs" in decided.reason
    assert plan(POOL, Inputs(demand=(QueueDemand("images"),))).action == "hold"


def test_the_spend_cap_and_min_workers() -> None:
    capped = POOL.model_copy(update={"cost_per_hour": 0.10, "max_spend_per_hour": 0.25})
    decided = plan(capped, Inputs(demand=(FLOOD,), standing_slots=4))
    assert (decided.action, decided.count) == ("start", 2)
    assert "spend cap 0.25/h (now 0/h)" in decided.reason
    one_live = (BurstWorker("b1", "registered", 100),)
    assert (
        plan(capped, Inputs(demand=(FLOOD,), standing_slots=4, burst=one_live, spend_per_hour=0.1)).count == 1
    )
    at_cap = tuple(BurstWorker(f"b{i}", "registered", 100) for i in range(2))
    assert plan(capped, Inputs(demand=(FLOOD,), burst=at_cap, spend_per_hour=0.2)).action == "hold"
    floor = POOL.model_copy(update={"min_workers": 2})
    quiet = plan(floor, Inputs(demand=(QueueDemand("images"),)))
    assert (quiet.target, quiet.action, quiet.count) == (2, "start", 2)


def test_stale_inputs_start_at_most_one_and_never_scale_down() -> None:
    stale = "w1 heartbeat 200 s old"
    assert plan(POOL, Inputs(demand=(FLOOD,), standing_slots=4, stale=stale)).count == 1
    idle = (registered("b1", idle=600), registered("b2", idle=600))
    decided = plan(POOL, Inputs(demand=(QueueDemand("images"),), burst=idle, stale=stale))
    assert (decided.target, decided.action) == (0, "hold")
    assert "inputs stale (w1 heartbeat 200 s old): no scale-down" in decided.reason
    assert plan(POOL, Inputs(demand=(QueueDemand("images"),), burst=idle)).action == "drain"


def test_only_idle_workers_past_their_boot_grace_are_drained() -> None:
    burst = (
        registered("busy", idle=0, running=2),
        registered("young", idle=120, age=100),  # boot grace: 3 × 60 s
        registered("briefly-idle", idle=30),
        registered("idle", idle=61),
        registered("idlest", idle=900),
        BurstWorker("booting", "booting", age_seconds=20),
    )
    decided = plan(POOL, Inputs(demand=(QueueDemand("images"),), burst=burst))
    assert (decided.target, decided.action, decided.count) == (0, "drain", 2)
    assert decided.drain_ids == ("idlest", "idle")
    # Never more than the surplus: one worker too many drains one, the idlest.
    light = QueueDemand("images", ready=600, backlog_work_seconds=1200.0, arrival_work_rate=1.0)
    assert plan(POOL, Inputs(demand=(light,), burst=burst[2:5])).drain_ids == ("idlest",)


def test_pools_are_validated_with_the_field_named() -> None:
    assert parse_pools('[{"name": "a", "queues": ["images"]}]')[0].idle_after == 60
    for text, needle in [
        (
            '[{"name": "a", "queues": ["images"], "min_workers": 5, "max_workers": 2}]',
            "min_workers (5) is above",
        ),
        ('[{"name": "a", "queues": ["images"], "provider": "gce"}]', "provider"),
        ('[{"name": "a", "queues": ["pictures"]}]', "queues"),
        ('[{"name": "a", "queues": []}]', "queues"),
        ('[{"name": "a", "queues": ["images"], "slots": 4}]', "slots"),
    ]:
        with pytest.raises(pydantic.ValidationError, match=re.escape(needle)):
            parse_pools(text)
    with pytest.raises(ValueError, match="same name"):
        parse_pools('[{"name": "a", "queues": ["images"]}, {"name": "a", "queues": ["ocr"]}]')
