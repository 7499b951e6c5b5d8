"""The lanes of a worker of several queues (``--queues``, ``HM_WORKER_QUEUES``:
hypermedia/worker/unit/settings.py ``plan_lanes``): each queue's role and slots, sandbox uids
that do not overlap, and a clear error for every wrong spec."""

from __future__ import annotations

import pytest

from hypermedia.worker.unit.settings import UID_RANGE, UnitSettings, lanes_spec, plan_lanes


def test_each_queue_gets_its_role_its_slots_and_uids_after_the_lanes_before_it() -> None:
    plans = plan_lanes("images=4, documents", variable="--queues", as_root=True)
    # Each engine's queue keeps one slot's uids after its own for its scheduler consumer (ADR 0073).
    assert [(p.role.name, p.slots, p.uid_offset) for p in plans] == [
        ("imageworker", 4, 0),
        ("docworker", 2, 5),
    ]
    # The docworker's slot takes 2 uids (a job's, a listener's): 2 slots and its scheduler
    # consumer's take 6, so a third lane would start at 11.
    third = plan_lanes("images=4,documents,ocr=1", variable="--queues", as_root=True)[2]
    assert (third.role.name, third.uid_offset) == ("ocrworker", 11)
    assert lanes_spec(plans) == "images=4,documents=2"


def test_a_bulk_lane_is_served_by_its_engines_role_beside_that_engines_own_queue() -> None:
    """ADR 0057: ``bulk.images`` is a lane of the imageworker's role, apart from ``images``; a
    bulk lane has no scheduler consumer, so it keeps no uid for one."""
    plans = plan_lanes("images=2,bulk.images=1,bulk.ocr", variable="--queues", as_root=True)
    assert [(p.queue, p.role.name, p.slots, p.uid_offset) for p in plans] == [
        ("images", "imageworker", 2, 0),
        ("bulk.images", "imageworker", 1, 3),
        ("bulk.ocr", "ocrworker", 2, 4),
    ]
    assert lanes_spec(plans) == "images=2,bulk.images=1,bulk.ocr=2"


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("", "--queues: give queues as a comma list, e.g. images=4,documents=2"),
        ("images,,ocr", "--queues: give queues as a comma list"),
        (
            "images,videos",
            "--queues: 'videos' is not one of images, documents, ocr, media, bulk.images, bulk.documents",
        ),
        ("bulk=2", "--queues: 'bulk' is not one of"),
        ("bulk.images,bulk.images=1", "--queues: bulk.images is given twice"),
        ("images,images=2", "--queues: images is given twice"),
        ("images=0", "--queues: the slots of images must be a whole number 1-64"),
        ("images=65", "--queues: the slots of images must be a whole number 1-64"),
        ("images=٣", "--queues: the slots of images must be a whole number 1-64"),
        ("images=", "--queues: the slots of images must be a whole number 1-64"),
        ("images=" + "9" * 5000, "--queues: the slots of images must be a whole number 1-64"),
    ],
)
def test_a_wrong_spec_is_refused_naming_the_option(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        plan_lanes(spec, variable="--queues", as_root=False)


def test_with_root_the_lanes_uids_must_fit_in_one_workers_range() -> None:
    assert (
        sum(p.slots for p in plan_lanes("images=63", variable="HM_WORKER_QUEUES", as_root=True)) + 1
        == UID_RANGE
    )
    assert sum(p.slots for p in plan_lanes("bulk.images=64", variable="HM_WORKER_QUEUES", as_root=True)) == 64
    with pytest.raises(ValueError, match="HM_WORKER_QUEUES: the lanes take 65 sandbox uids with root"):
        plan_lanes("images=64", variable="HM_WORKER_QUEUES", as_root=True)
    with pytest.raises(ValueError, match="HM_WORKER_QUEUES: the lanes take 70 sandbox uids with root"):
        plan_lanes("images=63,documents", variable="HM_WORKER_QUEUES", as_root=True)
    assert len(plan_lanes("images=64,documents", variable="HM_WORKER_QUEUES", as_root=False)) == 2


def test_controls_deadlines_default_to_the_documented_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The e2e tests run a unit with a shorter silence; what a deployment gets unless it says
    otherwise is docs/operations.md's: a 15 s lease, a sample a second, 30 s of silence."""
    for variable in ("HM_UNIT_LEASE_SECONDS", "HM_UNIT_SAMPLE_SECONDS", "HM_UNIT_STATUS_SILENCE_SECONDS"):
        monkeypatch.delenv(variable, raising=False)
    settings = UnitSettings()
    assert (settings.lease_seconds, settings.sample_seconds, settings.status_silence_seconds) == (
        15.0,
        1.0,
        30.0,
    )
