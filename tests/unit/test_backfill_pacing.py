"""A backfill run's pure parts: its token bucket, its items' idempotency keys, and the brake's
setting (ADR 0058)."""

from __future__ import annotations

import pytest

from hypermedia.jobs.backfill.dispatch import refill
from hypermedia.jobs.backfill.selection import idempotency_key, params_hash
from services.gateway.settings import BRAKE_DEFAULT, parse_brake


def test_the_bucket_refills_at_the_rate_up_to_one_second_of_it() -> None:
    assert refill(0.0, 0.5, 10.0) == pytest.approx(5.0)
    assert refill(3.0, 100.0, 10.0) == 10.0  # one second of rate at most
    assert refill(0.0, 100.0, 0.2) == 1.0  # but always room for one job
    assert refill(0.4, 1.0, 0.2) == pytest.approx(0.6)
    assert refill(2.0, -5.0, 10.0) == 2.0  # a clock step back adds nothing


def test_an_items_key_names_object_operation_params_and_version_and_fits_the_bound() -> None:
    object_id = "8f14e45f-ceea-467a-9f3b-5a0b1a2f7c11"
    key = idempotency_key(object_id, "thumbnail", {"size": 128, "format": "webp"}, 3)
    assert key == idempotency_key(object_id, "thumbnail", {"format": "webp", "size": 128}, 3)  # key order
    assert key.startswith(f"backfill:{object_id}:thumbnail:") and key.endswith(":v3")
    assert key != idempotency_key(object_id, "thumbnail", {"size": 129, "format": "webp"}, 3)
    assert key != idempotency_key(object_id, "thumbnail", {"size": 128, "format": "webp"}, 4)
    assert idempotency_key(object_id, "thumbnail", {}, 3, replays=2).endswith(":v3:replay2")
    assert len(idempotency_key(object_id, "x" * 64, {}, 10**6, replays=10**6)) <= 200
    assert len(params_hash({"a": "é"})) == 32


def test_the_brake_setting_is_read_and_refused_naming_its_variable() -> None:
    assert parse_brake(BRAKE_DEFAULT) == {"images": 5.0, "documents": 30.0, "ocr": 120.0, "media": 300.0}
    assert parse_brake("") == {}
    assert parse_brake(" images = 2.5 ") == {"images": 2.5}
    for bad in ("bulk=5", "images=5,images=6", "images=fast", "images=0", "images=nan", "images"):
        with pytest.raises(ValueError, match="HM_BACKFILL_BRAKE"):
            parse_brake(bad)
