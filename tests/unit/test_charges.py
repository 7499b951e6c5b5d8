"""The charge rules of hypermedia.jobs.charges (ADR 0068), on the profiles' real prices."""

from __future__ import annotations

import pytest

from hypermedia.jobs import charges
from hypermedia.jobs.pricing import MIB, price

PDF_PREVIEW = {"base_cost": 1000, "per_mb": 200, "work_unit": "page", "per_unit": 50}
"""Migration 0007 and 0028's pdf_preview profile."""


def _preview(size_bytes: int, pages: list[int]) -> charges.Charge:
    return charges.for_completion(
        price=price(PDF_PREVIEW["base_cost"], PDF_PREVIEW["per_mb"], size_bytes),
        base_cost=PDF_PREVIEW["base_cost"],
        work_unit="page",
        per_unit=PDF_PREVIEW["per_unit"],
        metadata=[{"page": n, "page_count": 40, "width": 800} for n in pages],
    )


def test_a_page_preview_of_a_large_pdf_is_charged_the_page_not_the_megabytes() -> None:
    charge = _preview(10 * MIB, [1])
    assert charge == charges.Charge(1050, {"pages": 50})  # 3000 were held


def test_the_work_line_is_cut_to_the_price_held() -> None:
    # 40 pages of a 76 KiB PDF: 1000 + 40 × 50 measured, 1015 held.
    charge = _preview(76 * 1024, list(range(1, 41)))
    assert charge == charges.Charge(1015, {"pages": 15})


def test_pages_are_counted_once_from_previews_and_ocr_page_lists() -> None:
    metadata = [{"page": 2}, {"page": 2}, {"pages": [1, 2, 3]}, {"pages": [True, "4", 5.0]}, {"page": None}]
    assert charges.pages(metadata) == 3


def test_an_operation_priced_by_size_is_charged_its_price() -> None:
    charge = charges.for_completion(price=1204, base_cost=1000, work_unit=None, per_unit=0, metadata=[{}])
    assert charge == charges.Charge(1204)


def test_an_unknown_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="megapixel"):
        charges.for_completion(price=5000, base_cost=5000, work_unit="megapixel", per_unit=1, metadata=[])


def test_a_ladder_is_charged_the_seconds_of_every_rendition_once() -> None:
    """Three renditions of a 60 s clip with their HLS playlists and fragments (which report no
    duration): 180.03 media seconds at 10 millicredits, rounded up, held 15,000 for 50 MiB."""
    metadata = [
        {"duration_seconds": 60.01, "frame_count": 1500},
        {"duration_seconds": 60.01, "frame_count": 1500},
        {"duration_seconds": 60.01, "frame_count": 1500},
        {"segments": 10, "bandwidth": 800_000},
        {"renditions": ["720p", "360p", "240p"]},
        {"duration_seconds": None},
        {"duration_seconds": float("nan")},
    ]
    charge = charges.for_completion(
        price=15_000, base_cost=5000, work_unit="media_second", per_unit=10, metadata=metadata
    )
    assert charge == charges.Charge(6801, {"media_seconds": 1801})


@pytest.mark.parametrize(
    ("run_ms", "price", "expected"),
    [
        (0, 3000, charges.Charge(1000)),
        (1, 3000, charges.Charge(1010, {"run_seconds": 10})),
        (90_000, 3000, charges.Charge(1900, {"run_seconds": 900})),  # three 30 s timeouts
        (90_000, 1004, charges.Charge(1004, {"run_seconds": 4})),  # cut to the price held
        (5_000, 800, charges.Charge(800)),  # a price below base_cost (a cheaper older version)
    ],
)
def test_a_failure_of_the_input_is_charged_base_and_run_seconds_within_the_price(
    run_ms: int, price: int, expected: charges.Charge
) -> None:
    assert charges.for_failure(price=price, base_cost=1000, run_ms=run_ms) == expected
