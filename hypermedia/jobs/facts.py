"""What a job learned about its input while it read it, kept on the input object (``objects.facts``,
migration 0035) so that an estimate of a later job on that object knows its size in the terms the
work is measured in (``POST /v1/hypermedia/estimate``, :mod:`services.gateway.estimates`): an
image's ``width`` and ``height``, a document's ``pages``, a recording's ``media_seconds``.

They come from the outputs' metadata the sandboxed engine reported, so they are a hostile file's
child's word: each is checked for type and bounded here (the worker, before it sends them) and
again by storage (:func:`checked`, before it stores them). The credits a job holds are its price
by size, never these; an image job's charge is measured on its ``width`` × ``height``
(:func:`hypermedia.jobs.charges.megapixels`), so a lie there can lower that charge to ``base``,
never raise it past the hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

MAX_SIDE: Final = 1_000_000
"""Largest ``width`` or ``height`` kept, pixels (libvips' own limit is 10,000,000; the imaging
profiles refuse inputs far below it)."""
MAX_PAGES: Final = 1_000_000
MAX_MEDIA_SECONDS: Final = 1_000_000.0
"""About 11.6 days: far over the media queue's longest input."""

FACTS: Final = ("width", "height", "pages", "media_seconds")
"""The facts kept, in this order."""


def of(metadata: Iterable[Mapping[str, Any]]) -> dict[str, int | float]:
    """The input facts the outputs' ``metadata`` report (``{}`` when none): the largest
    ``source_width`` × ``source_height`` pair (the imaging engine's), the largest ``page_count``
    (a document's or a scan's pages: previews, text, OCR), and the largest ``duration_seconds``
    (a rendition's, an audio file's, a waveform's: the input's length within a frame). Values of
    the wrong type, not finite, not positive or past the bounds are left out."""
    found: dict[str, int | float] = {}
    for meta in metadata:
        width, height = (
            _integer(meta.get("source_width"), MAX_SIDE),
            _integer(meta.get("source_height"), MAX_SIDE),
        )
        if width and height and width * height > found.get("width", 0) * found.get("height", 0):
            found["width"], found["height"] = width, height
        pages = _integer(meta.get("page_count"), MAX_PAGES)
        if pages and pages > found.get("pages", 0):
            found["pages"] = pages
        seconds = duration(meta.get("duration_seconds"))
        if seconds and seconds > found.get("media_seconds", 0.0):
            found["media_seconds"] = round(seconds, 3)
    return found


def duration(value: Any) -> float | None:
    """A reported ``duration_seconds`` (a hostile child's word) as the facts keep it: a finite
    number above 0 and at most :data:`MAX_MEDIA_SECONDS`, else None."""
    return _number(value, MAX_MEDIA_SECONDS)


def checked(facts: Mapping[str, Any]) -> dict[str, int | float]:
    """``facts`` with only the known keys of valid values (as :func:`of` keeps them); ``width``
    and ``height`` only together. For a caller that did not make them itself (storage)."""
    kept: dict[str, int | float] = {}
    width, height = _integer(facts.get("width"), MAX_SIDE), _integer(facts.get("height"), MAX_SIDE)
    if width and height:
        kept["width"], kept["height"] = width, height
    if pages := _integer(facts.get("pages"), MAX_PAGES):
        kept["pages"] = pages
    if seconds := _number(facts.get("media_seconds"), MAX_MEDIA_SECONDS):
        kept["media_seconds"] = round(seconds, 3)
    return kept


def measure(facts: Mapping[str, Any]) -> dict[str, float]:
    """The measures an estimate fits run times on, from an object's facts: ``pixels`` (width ×
    height), ``pages``, ``media_seconds``; only those the facts give."""
    measures: dict[str, float] = {}
    if facts.get("width") and facts.get("height"):
        measures["pixels"] = float(facts["width"]) * float(facts["height"])
    for name in ("pages", "media_seconds"):
        if facts.get(name):
            measures[name] = float(facts[name])
    return measures


def _integer(value: Any, bound: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= bound:
        return value
    return None


def _number(value: Any, bound: float) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if 0 < value <= bound:
            return float(value)
    return None
