"""How long a job of an operation will take, predicted from the history of that operation's
attempts (``POST /v1/hypermedia/estimate``): a least-squares line of the run time over the last
:data:`HISTORY` completed attempts (those on inputs of the same type, where there are enough)
where it explains the run times, and their median where no line does. The line is on the input's pixels, pages or media seconds when an earlier job on the object
learned them (``objects.facts``, :mod:`hypermedia.jobs.facts`) and enough of the history's inputs
have them too; else on the input's size in bytes (a 40 MB scan predicted longer than a 2 MB one)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Final

import asyncpg

from hypermedia.jobs import facts

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
    """``pixels``, ``pages``, ``media_seconds`` or ``size`` (a line on that measure of the input),
    ``median`` (no measure explained enough) or ``none``."""


MEASURES: Final = ("pixels", "pages", "media_seconds")
"""The input's measures tried beside its size (:func:`hypermedia.jobs.facts.measure`)."""
SCALE: Final = {"pixels": 1e6, "pages": 1.0, "media_seconds": 1.0}
"""Each measure's unit in the fit: megapixels, pages, seconds."""


def explained(history: list[tuple[float, float]]) -> float:
    """The share of the run times' variance a least-squares line on the measure explains (r²) in
    ``(measure, seconds)`` pairs; 0 when the line is undefined or falls (a larger input faster)."""
    if len(history) < 2:
        return 0.0
    mean_x, mean_time = statistics.fmean(x for x, _ in history), statistics.fmean(t for _, t in history)
    spread = sum((x - mean_x) ** 2 for x, _ in history)
    time_spread = sum((t - mean_time) ** 2 for _, t in history)
    covariance = sum((x - mean_x) * (t - mean_time) for x, t in history)
    if spread <= 1e-9 or time_spread <= 1e-12 or covariance <= 0:
        return 0.0
    return covariance**2 / (spread * time_spread)


def fit(history: list[tuple[float, float]], size_mb: float, measure: str = "size") -> Prediction:
    """The run time of an input of ``size_mb`` (MiB; or of another ``measure``) predicted from
    ``(size_mb, seconds)`` pairs: ordinary least squares where the measure explains at least
    :data:`MIN_EXPLAINED` of the run times' variance (:func:`explained`; the result at least the
    fastest seen; basis ``measure``); else the median."""
    if len(history) < MIN_SAMPLES:
        return Prediction(None, len(history), "none")
    seconds = [t for _, t in history]
    if explained(history) < MIN_EXPLAINED:
        # The measure says little about the run here (a JPEG's thumbnail costs about the same
        # whatever its pixels): the median is the better guess (bench/estimate_accuracy.py).
        return Prediction(round(statistics.median(seconds), 3), len(history), "median")
    mean_x, mean_time = statistics.fmean(x for x, _ in history), statistics.fmean(seconds)
    slope = sum((x - mean_x) * (t - mean_time) for x, t in history) / sum(
        (x - mean_x) ** 2 for x, _ in history
    )
    predicted = max(min(seconds), mean_time + slope * (size_mb - mean_x))
    return Prediction(round(predicted, 3), len(history), measure)


async def object_facts(pool: asyncpg.Pool, object_id: str) -> dict[str, float]:
    """The measures earlier jobs learned of the object (:func:`hypermedia.jobs.facts.measure`;
    ``{}``: none yet, or no such object)."""
    known = await pool.fetchval("SELECT facts FROM objects WHERE object_id = $1::uuid", object_id)
    return facts.measure(known or {})


async def predict(
    pool: asyncpg.Pool, operation: str, size_bytes: int, known: dict[str, float], mime_type: str = ""
) -> Prediction:
    """:func:`fit` over the operation's last :data:`HISTORY` completed attempts of the last
    :data:`HISTORY_DAYS` days (their run in the sandbox, ``job_attempts.duration_ms``, and their
    input's type, facts and size), through the index of completed attempts by time, as
    :func:`choose` chooses."""
    rows = await pool.fetch(
        """
        SELECT o.size_bytes, o.mime_type, o.facts, a.duration_ms FROM job_attempts a
        JOIN processing_jobs j USING (job_id) JOIN objects o ON o.object_id = j.object_id
        WHERE a.status = 'completed' AND j.operation = $1 AND a.duration_ms IS NOT NULL
          AND a.finished_at > now() - make_interval(days => $3)
        ORDER BY a.finished_at DESC LIMIT $2
        """,
        operation,
        HISTORY,
        HISTORY_DAYS,
    )
    history = [
        Run(r["size_bytes"] / MIB, facts.measure(r["facts"] or {}), r["duration_ms"] / 1000, r["mime_type"])
        for r in rows
    ]
    return choose(history, size_bytes / MIB, known, mime_type)


@dataclass(frozen=True)
class Run:
    """One completed attempt of the history: its input's size (MiB) and measures, its run (s)."""

    size_mb: float
    measures: dict[str, float]
    seconds: float
    mime_type: str = ""


def choose(history: list[Run], size_mb: float, known: dict[str, float], mime_type: str = "") -> Prediction:
    """The prediction for an input of type ``mime_type`` and ``size_mb`` MiB with the ``known``
    measures, from the runs on inputs of the same type where there are at least
    :data:`MIN_SAMPLES` of them (a 12 MP HEIC, which has no shrink-on-load, thumbnails 3× slower
    than a 24 MP JPEG: bench/estimate_accuracy.py), else from every run. Of the lines on the size
    and on each of :data:`MEASURES` it knows (over the runs that know that measure too, at least
    :data:`MIN_SAMPLES`), the one that explains the most (:func:`explained`) where it explains at
    least :data:`MIN_EXPLAINED`; else the median (:func:`fit`)."""
    same_type = [run for run in history if mime_type and run.mime_type == mime_type]
    if len(same_type) >= MIN_SAMPLES:
        history = same_type
    by_size = [(run.size_mb, run.seconds) for run in history]
    best = ("size", by_size, size_mb)
    best_explained = explained(by_size)
    for measure in MEASURES:
        if measure not in known:
            continue
        pairs = [
            (run.measures[measure] / SCALE[measure], run.seconds)
            for run in history
            if measure in run.measures
        ]
        if len(pairs) >= MIN_SAMPLES and (share := explained(pairs)) > best_explained:
            best, best_explained = (measure, pairs, known[measure] / SCALE[measure]), share
    measure, pairs, x = best
    return fit(pairs, x, measure) if best_explained >= MIN_EXPLAINED else fit(by_size, size_mb)
