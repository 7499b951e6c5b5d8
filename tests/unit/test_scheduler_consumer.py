"""The scheduler consumer's routes and settings (issue 25 item 3, ADR 0073): the sched queue's
lane of each engine (every band, stream ``HM_SCHED``), and the one-slot lane a worker runs beside
its ordinary slots, with sandbox uids after theirs; none beside a bulk lane or when turned off."""

from __future__ import annotations

import os

import pytest

from hypermedia.core import config
from hypermedia.jobs import queues
from hypermedia.worker import registry, scheduled
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit.settings import UID_RANGE, validate


def test_a_sched_lane_per_engine_with_every_band_in_its_own_stream() -> None:
    assert [queues.sched_route(q) for q in queues.ENGINE_QUEUES] == [
        "sched.images",
        "sched.documents",
        "sched.ocr",
        "sched.media",
    ]
    assert queues.is_sched("sched.ocr") and not queues.is_sched("ocr") and not queues.is_sched("bulk.ocr")
    assert queues.engine_of("sched.media") == "media" and queues.engine_of("bulk.media") == "media"
    assert queues.bands("sched.images") == tuple(range(1, 11))
    assert queues.subject("HM", "sched.images", 1) == "hm.jobs.sched.images.p1"
    assert queues.stream_name("HM", "sched.images") == "HM_SCHED"
    assert queues.consumer_name("sched.documents", 10) == "sched-documents-p10"
    assert queues.doorbell_for("hm.jobs.sched.images.p3") == "hm.ready.sched.images"
    for wrong in ("bulk", "sched", "sched.images", "videos"):
        with pytest.raises(ValueError, match="no sched lane for"):
            queues.sched_route(wrong)


def _settings(**env: object) -> WorkerSettings:
    return config.load(WorkerSettings, **{"HM_SANDBOX_UID_BASE": 61000, **env})


def test_the_consumer_is_one_slot_of_the_engines_sched_lane_with_uids_after_the_lanes() -> None:
    own = scheduled.consumer_settings(
        _settings(HM_WORKER_QUEUE="images", HM_WORKER_SLOTS=4), "imageworker", as_root=True
    )
    assert own is not None
    assert (own.queue, own.slots, own.sandbox_uid_base) == ("sched.images", 1, 61004)
    # A docworker slot takes two uids (a job's and its office listener's).
    docs = scheduled.consumer_settings(
        _settings(HM_WORKER_QUEUE="documents", HM_WORKER_SLOTS=2), "docworker", as_root=True
    )
    assert docs is not None and (docs.queue, docs.sandbox_uid_base) == ("sched.documents", 61004)


def test_no_consumer_beside_a_bulk_lane_or_when_turned_off() -> None:
    assert (
        scheduled.consumer_settings(_settings(HM_WORKER_QUEUE="bulk.images"), "imageworker", as_root=True)
        is None
    )
    off = _settings(HM_WORKER_QUEUE="ocr", HM_WORKER_SCHEDULER="off")
    assert scheduled.consumer_settings(off, "ocrworker", as_root=True) is None
    with pytest.raises(config.ConfigError, match="HM_WORKER_SCHEDULER"):
        _settings(HM_WORKER_SCHEDULER="sometimes")


def test_with_root_the_lane_and_its_consumer_must_fit_in_one_workers_uids() -> None:
    full = _settings(HM_WORKER_QUEUE="images", HM_WORKER_SLOTS=UID_RANGE)
    with pytest.raises(config.ConfigError, match="with root the imageworker runs at most 63 slots"):
        scheduled.consumer_settings(full, "imageworker", as_root=True)
    assert scheduled.consumer_settings(full, "imageworker", as_root=False) is not None
    docs = _settings(HM_WORKER_QUEUE="documents", HM_WORKER_SLOTS=32)
    with pytest.raises(config.ConfigError, match="with root the docworker runs at most 31 slots"):
        scheduled.consumer_settings(docs, "docworker", as_root=True)


def test_the_consumers_worker_id_is_its_lanes_with_sched_appended() -> None:
    lane = _settings(HM_WORKER_QUEUE="images")
    consumer = scheduled.consumer_settings(lane, "imageworker", as_root=False)
    assert consumer is not None
    ordinary = registry.worker_identity(lane, "imageworker")
    assert registry.worker_identity(consumer, "imageworker") == ordinary + "/sched"


def test_the_consumer_works_in_a_directory_of_its_own() -> None:
    """Its job directories and a docworker's office listeners (named by slot: ``slot0``) must
    not meet the lane's: each lane's start clears its job directories of leftovers."""
    lane = _settings(HM_WORKER_QUEUE="documents", HM_WORKER_SLOTS=2, HM_WORK_DIR="/srv/hm/work")
    consumer = scheduled.consumer_settings(lane, "docworker", as_root=False)
    assert consumer is not None and consumer.work_dir == "/srv/hm/work/sched"


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"HM_WORKER_QUEUE": "sched.images"}, "HM_WORKER_QUEUE: Input should be 'images'"),
        ({"HM_WORKER_SLOTS": "64"}, "HM_WORKER_SLOTS: with root the imageworker runs at most 63 slots"),
    ],
)
def test_a_unit_refuses_what_its_consumer_cannot_be_before_it_launches(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
) -> None:
    """Control's own check (exit 78, nothing launched), not execution's later: a sched lane is
    never a configured queue, and with root the slots must leave the consumer its uids."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(config.ConfigError) as refused:
        validate("imageworker", None)
    assert said in str(refused.value), str(refused.value)
