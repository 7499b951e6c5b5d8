"""How long a job of an operation will take, predicted from the history of that operation's
attempts (``POST /v1/hypermedia/estimate``): a least-squares line of the run time on the input's
size over the last :data:`HISTORY` completed attempts, so a 40 MB scan is predicted longer than a
2 MB one where the history shows sizes matter, and the median where it does not."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Final

import asyncpg

HISTORY: Final = 200
"""Completed attempts of the operation read (the most recent)."""
MIN_SAMPLES: Final = 5
"""Fewer completed attempts than this: no prediction (``predicted_seconds`` null)."""
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class Prediction:
    """A predicted run time, seconds (None without enough history), from ``samples`` attempts."""

    seconds: float | None
    samples: int
    basis: str
    """``size`` (a line on the input's size), ``median`` (sizes did not vary) or ``none``."""


def fit(history: list[tuple[float, float]], size_mb: float) -> Prediction:
    """The run time of an input of ``size_mb`` MiB predicted from ``(size_mb, seconds)`` pairs:
    ordinary least squares, the slope clamped at 0 (a larger input is never predicted faster) and
    the result at the fastest seen; the median when the sizes did not vary."""
    if len(history) < MIN_SAMPLES:
        return Prediction(None, len(history), "none")
    sizes = [s for s, _ in history]
    seconds = [t for _, t in history]
    mean_size, mean_time = statistics.fmean(sizes), statistics.fmean(seconds)
    spread = sum((s - mean_size) ** 2 for s in sizes)
    if spread < 1e-9:
        return Prediction(round(statistics.median(seconds), 3), len(history), "median")
    slope = max(0.0, sum((s - mean_size) * (t - mean_time) for s, t in history) / spread)
    predicted = max(min(seconds), mean_time + slope * (size_mb - mean_size))
    return Prediction(round(predicted, 3), len(history), "size")


async def predict(pool: asyncpg.Pool, operation: str, size_bytes: int) -> Prediction:
    """:func:`fit` over the operation's last :data:`HISTORY` completed attempts (their run in the
    sandbox, ``job_attempts.duration_ms``, and their input's size), through the index of completed
    attempts by time."""
    rows = await pool.fetch(
        """
        SELECT o.size_bytes, a.duration_ms FROM job_attempts a
        JOIN processing_jobs j USING (job_id) JOIN objects o ON o.object_id = j.object_id
        WHERE a.status = 'completed' AND j.operation = $1 AND a.duration_ms IS NOT NULL
        ORDER BY a.finished_at DESC LIMIT $2
        """,
        operation,
        HISTORY,
    )
    history = [(r["size_bytes"] / MIB, r["duration_ms"] / 1000) for r in rows]
    return fit(history, size_bytes / MIB)
