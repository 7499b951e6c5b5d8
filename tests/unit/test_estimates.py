"""The run-time prediction of ``POST /v1/hypermedia/estimate`` (issue 22 item 3): a line on the
input's size from the operation's history where size explains the run times, else the median;
nothing from too little history; never faster for a larger input."""

from __future__ import annotations

from hypermedia.jobs import facts
from services.gateway.estimates import MIN_SAMPLES, Prediction, Run, choose, fit


def test_too_little_history_predicts_nothing() -> None:
    assert fit([(1.0, 0.2)] * (MIN_SAMPLES - 1), 1.0).seconds is None
    assert fit([], 1.0).basis == "none"


def test_one_size_gives_the_median() -> None:
    prediction = fit([(2.0, t) for t in (0.1, 0.2, 0.9, 0.3, 0.25)], 40.0)
    assert (prediction.seconds, prediction.basis, prediction.samples) == (0.25, "median", 5)


def test_a_line_on_size_where_size_matters() -> None:
    history = [(s, 0.1 + 0.05 * s) for s in (1.0, 2.0, 4.0, 8.0, 16.0)]
    prediction = fit(history, 32.0)
    assert prediction.basis == "size"
    assert abs((prediction.seconds or 0) - 1.7) < 1e-6


def test_a_larger_input_is_never_predicted_faster() -> None:
    history = [(1.0, 2.0), (2.0, 1.5), (4.0, 1.0), (8.0, 0.8), (16.0, 0.5)]  # runs that fall with size
    small, large = fit(history, 1.0), fit(history, 100.0)
    assert small == large and small.basis == "median" and small.seconds == 1.0


def test_where_size_explains_little_the_median() -> None:
    history = [(1.0, 0.3), (2.0, 0.1), (4.0, 0.5), (8.0, 0.2), (16.0, 0.35), (0.5, 0.45)]  # noise
    prediction = fit(history, 16.0)
    assert (prediction.basis, prediction.seconds) == ("median", 0.325)


def test_a_line_on_another_measure_is_named_by_it() -> None:
    history = [(mp, 0.02 + 0.01 * mp) for mp in (0.3, 1.0, 2.0, 6.0, 12.0)]  # megapixels
    prediction = fit(history, 24.0, "pixels")
    assert prediction.basis == "pixels" and abs((prediction.seconds or 0) - 0.26) < 1e-6


def test_facts_keep_what_the_outputs_report_within_bounds() -> None:
    outputs = [
        {"width": 256, "height": 171, "source_width": 4000, "source_height": 3000},
        {"page": 2, "page_count": 40},
        {"duration_seconds": 93.25},
        {"duration_seconds": 93.5},  # the longest rendition
    ]
    assert facts.of(outputs) == {"width": 4000, "height": 3000, "pages": 40, "media_seconds": 93.5}
    assert facts.measure(facts.of(outputs)) == {"pixels": 12e6, "pages": 40.0, "media_seconds": 93.5}
    hostile = [
        {"source_width": 10**9, "source_height": 10},  # past the bound
        {"source_width": 640},  # half a size
        {"page_count": True, "duration_seconds": float("inf")},
        {"page_count": "40", "duration_seconds": -3},
    ]
    assert facts.of(hostile) == {}
    assert facts.checked({"width": 5, "pages": 0, "media_seconds": 1e12, "other": 1}) == {}
    assert facts.checked({"width": 5, "height": 7, "pages": 3, "media_seconds": 2.0004}) == {
        "width": 5,
        "height": 7,
        "pages": 3,
        "media_seconds": 2.0,
    }


def test_runs_on_inputs_of_the_same_type_decide_where_there_are_enough() -> None:
    jpegs = [Run(1.0, {"pixels": 12e6}, t, "image/jpeg") for t in (0.05, 0.06, 0.07, 0.06, 0.05, 0.06)]
    heics = [Run(0.8, {"pixels": 12e6}, t, "image/heic") for t in (0.30, 0.33, 0.31, 0.35, 0.32)]
    assert choose(jpegs + heics, 0.8, {}, "image/heic") == Prediction(0.32, 5, "median")
    assert choose(jpegs + heics, 1.0, {}, "image/jpeg") == Prediction(0.06, 6, "median")
    # Four PNGs are too few to judge a PNG by: every run then (where the size now explains them).
    pngs = [Run(0.1, {}, 0.02, "image/png")] * 4
    mixed = choose(jpegs + pngs, 0.1, {}, "image/png")
    assert (mixed.samples, mixed.basis) == (10, "size") and 0.015 < (mixed.seconds or 0) < 0.025
