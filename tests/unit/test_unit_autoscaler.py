"""The worker unit's autoscaler decisions (hypermedia/worker/unit/autoscaler.py) on samples made
here: one slot without measurements, pressure closes and only a newer sample under the recovery
line reopens, growth needs a new sample and a backlog, shrink is at once."""

from __future__ import annotations

from hypermedia.worker.unit.autoscaler import SAMPLE_MAX_AGE_SECONDS, Autoscaler, SharedRoom
from hypermedia.worker.unit.evidence import Sample

MB = 1024 * 1024


def sample(
    at: float,
    memory_mb: int,
    limit_mb: int = 4096,
    pids: int = 40,
    pids_limit: int = 1000,
    stall: float | None = None,
) -> Sample:
    return Sample(at, memory_mb * MB, memory_mb * MB, limit_mb * MB, pids, pids_limit, stall)


def test_without_a_sample_admission_holds_at_one() -> None:
    scaler = Autoscaler(slots=8, job_memory_mb=256)
    decision = scaler.decide(None, backlog=50, busy=0, now=100.0)
    assert (decision.target, decision.reason) == (1, "no_measurements")


def test_a_stale_sample_holds_at_one_even_after_growth() -> None:
    scaler = Autoscaler(slots=8, job_memory_mb=256)
    assert scaler.decide(sample(100.0, 400), backlog=50, busy=0, now=100.0).target == 8
    old = scaler.decide(sample(100.0, 400), backlog=50, busy=3, now=100.0 + SAMPLE_MAX_AGE_SECONDS + 1)
    assert old.target == 1 and old.reason.startswith("stale_measurements")


def test_growth_is_bounded_by_memory_and_needs_a_backlog_and_a_new_sample() -> None:
    scaler = Autoscaler(slots=16, job_memory_mb=512, memory_source="measured")
    # 4096 * 0.9 = 3686 MiB; 1000 in use: 2686 MiB free = 5 jobs of 512 MiB.
    quiet = scaler.decide(sample(10.0, 1000), backlog=0, busy=0, now=10.0)
    assert quiet.target == 1 and quiet.reason.startswith("steady (no backlog)")
    grown = scaler.decide(sample(11.0, 1000), backlog=9, busy=0, now=11.0)
    assert grown.target == 5 and grown.reason.startswith("grow: memory for 5 jobs of 512 MiB (measured)")
    # The same sample again does not grow further even if it would allow it.
    scaler.last = grown.__class__(2, "x", 11.0, 11.0, 9)
    again = scaler.decide(sample(11.0, 1000), backlog=9, busy=0, now=11.5)
    assert again.target == 2 and "no new sample" in again.reason


def test_pids_bound_the_fit_too() -> None:
    scaler = Autoscaler(slots=16, job_memory_mb=64)
    # 1000 * 0.9 - 860 = 40 pids free: 2 more jobs of 16.
    decision = scaler.decide(sample(1.0, 100, pids=860), backlog=5, busy=1, now=1.0)
    assert decision.target == 3


def test_shrink_is_at_once() -> None:
    scaler = Autoscaler(slots=8, job_memory_mb=256)
    assert scaler.decide(sample(1.0, 100), backlog=5, busy=0, now=1.0).target == 8
    shrunk = scaler.decide(sample(2.0, 3000), backlog=5, busy=4, now=2.0)
    # (3686 - 3000) // 256 = 2 more beside the 4 running.
    assert shrunk.target == 6 and shrunk.reason.startswith("shrink")


def test_memory_pressure_closes_until_a_newer_sample_is_under_the_recovery_line() -> None:
    scaler = Autoscaler(slots=4, job_memory_mb=256)
    closed = scaler.decide(sample(1.0, 3800), backlog=5, busy=2, now=1.0)
    assert closed.target == 0 and closed.reason.startswith("memory_pressure: 3800 of 4096 MiB")
    # Between the recovery line (80 %) and the severe line (90 %): still closed.
    assert scaler.decide(sample(2.0, 3400), backlog=5, busy=2, now=2.0).target == 0
    # No sample at all: still closed, never "one slot".
    missing = scaler.decide(None, backlog=5, busy=2, now=2.5)
    assert missing.target == 0 and missing.reason.startswith("memory_pressure")
    reopened = scaler.decide(sample(3.0, 1000), backlog=5, busy=0, now=3.0)
    assert reopened.target >= 1 and scaler.closed is None


def test_pid_pressure_and_memory_stall_close_as_well() -> None:
    scaler = Autoscaler(slots=4, job_memory_mb=256)
    assert scaler.decide(sample(1.0, 100, pids=950), backlog=1, busy=0, now=1.0).reason.startswith(
        "pid_pressure"
    )
    scaler = Autoscaler(slots=4, job_memory_mb=256)
    stalled = scaler.decide(sample(1.0, 100, stall=55.0), backlog=1, busy=0, now=1.0)
    assert stalled.target == 0 and "stall 55 %" in stalled.reason


def test_queues_of_one_execution_share_the_free_memory() -> None:
    """Two queues with a backlog, 2686 MiB free under the severe line: the longer backlog's queue
    (given first) takes 4 jobs of 512 MiB (2048), the other what is left: 638 MiB = 2 jobs of
    256 MiB, not the 10 it would take alone. Once 3 image jobs run, their share is no longer
    pending."""
    room = SharedRoom()
    images = Autoscaler(slots=4, job_memory_mb=512, memory_source="measured")
    documents = Autoscaler(slots=16, job_memory_mb=256)
    first, second = room.decide([(images, 30, 0), (documents, 5, 0)], sample(10.0, 1000), now=10.0)
    assert (first.target, second.target) == (4, 2)
    assert "memory for 4 jobs of 512 MiB (measured)" in first.reason
    assert "memory for 2 jobs of 256 MiB" in second.reason
    # 3 image jobs started and took their 1536 MiB (now in memory.current): 1 is still pending.
    again = room.decide([(images, 30, 3), (documents, 5, 0)], sample(11.0, 1000 + 1536), now=11.0)
    # images: room 3686-2536 = 1150 minus documents' 2 pending (512) = 638: 3 + 1 = 4.
    # documents: 1150 minus images' 1 pending (512) = 638: 2 jobs of 256.
    assert [d.target for d in again] == [4, 2]


def test_an_idle_queue_holds_no_room_and_its_target_shrinks() -> None:
    """Room for 8 jobs of 256 MiB: documents had 4 admitted and its backlog went to 0; images
    with a long backlog then takes the whole room, and documents' target falls."""
    room = SharedRoom()
    images, documents = Autoscaler(slots=8, job_memory_mb=256), Autoscaler(slots=8, job_memory_mb=256)
    # 3686 - 1638 = 2048 MiB free: 8 jobs of 256.
    room.decide([(documents, 10, 0), (images, 0, 0)], sample(10.0, 1638), now=10.0)
    assert documents.last.target == 8
    room.decide([(images, 1000, 0), (documents, 0, 0)], sample(11.0, 1638), now=11.0)
    assert images.last.target == 8  # documents, idle, reserved nothing
    assert documents.last.target == 0 and documents.last.reason.startswith("shrink")


def test_without_measurements_the_unit_runs_one_job_and_the_turn_passes_between_queues() -> None:
    room = SharedRoom()
    images, documents = Autoscaler(slots=4, job_memory_mb=512), Autoscaler(slots=2, job_memory_mb=256)
    first = room.decide([(images, 9, 0), (documents, 3, 0)], None, now=10.0)
    assert [d.target for d in first] == [1, 0]
    assert first[0].reason == "no_measurements; the unit's one job: this queue's turn"
    # The status has not shown the job yet: the turn holds for TURN_HOLD_SECONDS.
    assert [d.target for d in room.decide([(images, 8, 0), (documents, 3, 0)], None, now=11.0)] == [1, 0]
    # The job runs: images keeps the turn while it does, documents gets nothing.
    assert [d.target for d in room.decide([(images, 8, 1), (documents, 3, 0)], None, now=20.0)] == [1, 0]
    # It ended: documents, which waited longest, has the next turn though images' backlog is longer.
    assert [d.target for d in room.decide([(images, 8, 0), (documents, 3, 0)], None, now=21.0)] == [0, 1]


def test_a_room_for_no_job_admits_one_in_the_unit_not_one_per_queue() -> None:
    """300 MiB free under the severe line, four queues of 2 GiB jobs: one job in all."""
    room = SharedRoom()
    scalers = [Autoscaler(slots=2, job_memory_mb=2048) for _ in range(4)]
    decided = room.decide([(s, 5, 0) for s in scalers], sample(10.0, 3386), now=10.0)
    assert sorted(d.target for d in decided) == [0, 0, 0, 1]


def test_pressure_closes_every_queue_of_the_execution() -> None:
    room = SharedRoom()
    images, documents = Autoscaler(slots=4, job_memory_mb=512), Autoscaler(slots=2, job_memory_mb=256)
    closed = room.decide([(images, 3, 1), (documents, 3, 1)], sample(10.0, 3800), now=10.0)
    assert [d.target for d in closed] == [0, 0]
    assert all(d.reason.startswith("memory_pressure") for d in closed)


def test_one_queue_decides_as_its_autoscaler_alone() -> None:
    alone, shared = Autoscaler(slots=8, job_memory_mb=256), Autoscaler(slots=8, job_memory_mb=256)
    assert (
        SharedRoom().decide([(shared, 0, 0)], None, now=5.0)[0].target
        == alone.decide(None, 0, 0, now=5.0).target
        == 1
    )
