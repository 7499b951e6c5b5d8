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


def test_a_unit_of_a_newer_release_is_charged_the_price(caplog: pytest.LogCaptureFixture) -> None:
    """A worker of this release reading a profile a later migration gave a new unit (a rollout
    that migrated before the workers were replaced) charges the price it held, never more."""
    charge = charges.for_completion(
        price=5000, base_cost=1000, work_unit="gigaflop", per_unit=1, metadata=[{}]
    )
    assert charge == charges.Charge(5000)
    assert "gigaflop" in caplog.text


THUMBNAIL = {"base_cost": 1000, "per_mb": 200, "work_unit": "megapixel", "per_unit": 50}
"""Migration 0001 and 0036's thumbnail profile."""


def _thumbnail(size_bytes: int, width: int, height: int) -> charges.Charge:
    return charges.for_completion(
        price=price(THUMBNAIL["base_cost"], THUMBNAIL["per_mb"], size_bytes),
        base_cost=THUMBNAIL["base_cost"],
        work_unit="megapixel",
        per_unit=THUMBNAIL["per_unit"],
        metadata=[{"width": 256, "height": 171, "source_width": width, "source_height": height}],
    )


@pytest.mark.parametrize(
    ("size_bytes", "width", "height", "expected"),
    [
        # A 12 MP photo of 4 MiB: 1000 + 12 × 50 measured, 1800 held.
        (4 * MIB, 4000, 3000, charges.Charge(1600, {"megapixels": 600})),
        # A 0.5 MP PNG of 2 MiB: 25 millicredits of pixels where 400 of bytes were held.
        (2 * MIB, 1000, 500, charges.Charge(1025, {"megapixels": 25})),
        # tests/data/exif-orientation/Landscape_1.jpg, 1800 × 1200 in 347,327 bytes: 108 measured, 67 held.
        (347_327, 1800, 1200, charges.Charge(1067, {"megapixels": 67})),
        # A 1 × 1 GIF: a fraction of a millicredit, rounded up.
        (43, 1, 1, charges.Charge(1001, {"megapixels": 1})),
    ],
)
def test_an_image_is_charged_the_megapixels_it_decoded_within_its_hold(
    size_bytes: int, width: int, height: int, expected: charges.Charge
) -> None:
    assert _thumbnail(size_bytes, width, height) == expected


def test_megapixels_are_the_largest_source_any_output_reports() -> None:
    metadata = [
        {"source_width": 2000, "source_height": 1000},
        {"source_width": 2000, "source_height": 1000},
        {"source_width": 10, "source_height": 10},
        {"source_width": True, "source_height": 10**9},
        {"source_width": -5, "source_height": 10**9},
        {"source_width": "4000", "source_height": 3000},
        {"width": 4000, "height": 3000},
    ]
    assert charges.megapixels(metadata) == 2.0
    assert charges.megapixels([{}]) == 0.0


def test_durations_past_the_facts_bound_are_not_counted_and_never_overflow() -> None:
    metadata = [{"duration_seconds": 1e308}, {"duration_seconds": 1e308}, {"duration_seconds": 60.0}]
    assert charges.media_seconds(metadata) == 60.0
    charge = charges.for_completion(
        price=15_000, base_cost=5000, work_unit="media_second", per_unit=10, metadata=metadata
    )
    assert charge == charges.Charge(5600, {"media_seconds": 600})


@pytest.mark.parametrize("side", [10**6 + 1, 10**157, 10**200, 2**63])
def test_sides_past_the_facts_bound_are_not_measured_and_never_crash(side: int) -> None:
    """A hostile child's sizes past :data:`facts.MAX_SIDE` are ignored (0 megapixels, base only),
    not an overflow that would fail the job uncharged."""
    metadata = [{"source_width": side, "source_height": side}]
    assert charges.megapixels(metadata) == 0.0
    charge = charges.for_completion(
        price=9000, base_cost=1000, work_unit="megapixel", per_unit=50, metadata=metadata
    )
    assert charge == charges.Charge(1000)


def test_the_largest_bounded_image_is_charged_in_whole_millicredits() -> None:
    """10⁶ × 10⁶ pixels at 50 millicredits a megapixel, integer arithmetic, cut to the hold."""
    metadata = [{"source_width": 10**6, "source_height": 10**6}]
    assert charges.megapixels(metadata) == 1_000_000.0
    charge = charges.for_completion(
        price=9000, base_cost=1000, work_unit="megapixel", per_unit=50, metadata=metadata
    )
    assert charge == charges.Charge(9000, {"megapixels": 8000})


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


@pytest.mark.parametrize(
    ("code", "killed", "charged"),
    [
        ("TIMEOUT", "cpu_time", True),
        ("TIMEOUT", "wall_time", False),
        ("OCR_PAGE_TIMEOUT", "", True),  # a page's own CPU time: load does not change it
        ("RESOURCE_LIMIT", "memory", True),
        ("CORRUPT_INPUT", "", True),
        ("OCR_PAGE_LIMIT", "", False),  # refused before any work
        ("INTERNAL", "", False),
    ],
)
def test_which_failures_are_the_inputs(code: str, killed: str, charged: bool) -> None:
    assert charges.input_fault(code, killed) is charged
