"""The run-time prediction of ``POST /v1/hypermedia/estimate`` (issue 22 item 3): a line on the
input's size from the operation's history where size explains the run times, else the median;
nothing from too little history; never faster for a larger input."""

from __future__ import annotations

from services.gateway.estimates import MIN_SAMPLES, fit


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
