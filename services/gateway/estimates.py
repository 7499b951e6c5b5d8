"""How long a job of an operation will take, predicted from the history of that operation's
attempts (``POST /v1/hypermedia/estimate``): a least-squares line of the run time on the input's
size over the last :data:`HISTORY` completed attempts where size explains the run times (a 40 MB
scan predicted longer than a 2 MB one), and their median where it does not."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Final

import asyncpg

HISTORY: Final = 200
"""Completed attempts of the operation read (the most recent)."""
HISTORY_DAYS: Final = 30
"""Only attempts of the last 30 days: a rare operation's read stops there, not at the platform's
first attempt (the index of completed attempts is by time; the operation is filtered after)."""
MIN_SAMPLES: Final = 5
"""Fewer completed attempts than this: no prediction (``predicted_seconds`` null)."""
MIB: Final = 1024 * 1024
MIN_EXPLAINED: Final = 0.5
"""The share of the run times' variance the size must explain (r²) for the line to be used."""


@dataclass(frozen=True)
class Prediction:
    """A predicted run time, seconds (None without enough history), from ``samples`` attempts."""

    seconds: float | None
    samples: int
    basis: str
    """``size`` (a line on the input's size), ``median`` (size explained too little) or ``none``."""


def fit(history: list[tuple[float, float]], size_mb: float) -> Prediction:
    """The run time of an input of ``size_mb`` MiB predicted from ``(size_mb, seconds)`` pairs:
    ordinary least squares where size explains at least :data:`MIN_EXPLAINED` of the run times'
    variance and a larger input ran longer (the result at least the fastest seen); else the
    median."""
    if len(history) < MIN_SAMPLES:
        return Prediction(None, len(history), "none")
    sizes = [s for s, _ in history]
    seconds = [t for _, t in history]
    mean_size, mean_time = statistics.fmean(sizes), statistics.fmean(seconds)
    spread = sum((s - mean_size) ** 2 for s in sizes)
    time_spread = sum((t - mean_time) ** 2 for t in seconds)
    covariance = sum((s - mean_size) * (t - mean_time) for s, t in history)
    explained = covariance**2 / (spread * time_spread) if spread > 1e-9 and time_spread > 1e-12 else 0.0
    if explained < MIN_EXPLAINED or covariance <= 0:
        # Size says little about the run here (a thumbnail's cost is its pixels, not its bytes):
        # the median is the better guess (bench/estimate_accuracy.py measured both).
        return Prediction(round(statistics.median(seconds), 3), len(history), "median")
    predicted = max(min(seconds), mean_time + covariance / spread * (size_mb - mean_size))
    return Prediction(round(predicted, 3), len(history), "size")


async def predict(pool: asyncpg.Pool, operation: str, size_bytes: int) -> Prediction:
    """:func:`fit` over the operation's last :data:`HISTORY` completed attempts of the last
    :data:`HISTORY_DAYS` days (their run in the
    sandbox, ``job_attempts.duration_ms``, and their input's size), through the index of completed
    attempts by time."""
    rows = await pool.fetch(
        """
        SELECT o.size_bytes, a.duration_ms FROM job_attempts a
        JOIN processing_jobs j USING (job_id) JOIN objects o ON o.object_id = j.object_id
        WHERE a.status = 'completed' AND j.operation = $1 AND a.duration_ms IS NOT NULL
          AND a.finished_at > now() - make_interval(days => $3)
        ORDER BY a.finished_at DESC LIMIT $2
        """,
        operation,
        HISTORY,
        HISTORY_DAYS,
    )
    history = [(r["size_bytes"] / MIB, r["duration_ms"] / 1000) for r in rows]
    return fit(history, size_bytes / MIB)
