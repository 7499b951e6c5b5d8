"""What a job is charged: the work it did, never more than what it held (issue 23 item 3, ADR 0068).

The hold, taken when the job is created, is the seed's price (``base_cost + per_mb × size_mb``,
:func:`hypermedia.jobs.pricing.price`) plus any allowance (an OCR job's escalation): an upper
bound. What the job is charged when it ends:

* **completed**, operation with a ``work_unit``: its profile's ``base_cost`` plus ``per_unit`` ×
  the units its outputs report, the work line cut so that the two never exceed the price held.
  ``page`` (``pdf_preview``, ``ocr``): the distinct pages rendered or read, line ``pages``; a
  one-page preview of a 10 MiB PDF is charged 1.05 credits where 3 were held (``base`` 1,
  ``pages`` 0.05). ``media_second`` (``transcode_video``, ``transcode_audio``): the seconds of
  media written, summed over the renditions, line ``media_seconds``; three renditions of a 60 s
  clip are 180 media seconds, 1.8 credits beside ``base`` 5 at 10 millicredits each.
  ``megapixel`` (``thumbnail``, ``resize``, ``compress``, ``convert``): the megapixels of the
  source image the job read (its first frame's width × height, :func:`megapixels`), line ``megapixels``; a
  thumbnail of a 12 MP photo of 4 MB, held 1.8 credits, is charged 1.6 (``base`` 1,
  ``megapixels`` 0.6 at 50 millicredits each); one of a 0.5 MP PNG of 2 MB 1.025, held 1.4.
* **completed**, operation without one: its price; the bytes it read are its measure.
* **failed because of its input** (:data:`INPUT_FAULTS`: it used up its CPU time, or an OCR
  page its own, or ran out of memory, or the input turned out corrupt while the engine decoded
  it), once its sandbox child ran: the documented minimum for the resources it used, ``base_cost`` plus :data:`RUN_SECOND_MILLICREDITS`
  per second its child ran (over every attempt that failed so), never more than the price held.
  A thumbnail of a hostile file that uses up its 30 s of CPU three times is charged 1 + 0.9
  credits, cut to its price.
* **failed for any other reason** (the platform's: storage down, an internal error, a lost lease,
  a drain), **or cancelled**: nothing; the hold is released.

Each part beside ``base`` is a line of its own (``charge_lines``, a ledger row each): ``pages``,
``media_seconds``, ``megapixels``, ``run_seconds``, and the OCR worker's ``ocr_escalation``, which its allowance bounds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from hypermedia.jobs import facts

log = logging.getLogger(__name__)

INPUT_FAULTS: Final = frozenset({"TIMEOUT", "RESOURCE_LIMIT", "CORRUPT_INPUT", "OCR_PAGE_TIMEOUT"})
"""Error codes that are the input's fault when the sandbox child reports them: the job that
fails with one (after its last attempt) is charged :func:`for_failure`. ``OCR_PAGE_TIMEOUT`` is
a page's own 60 s of tesseract CPU time used up (ADR 0084), which load does not change. A ``TIMEOUT`` counts
only when the child used up its CPU time (:func:`input_fault`), counted over its processes (ADR
0084): a wall-clock kill before that may be a starved host's, not the input's."""
RUN_SECOND_MILLICREDITS: Final = 10
"""Millicredits per second (rounded up) a failed job's sandbox child ran: the ``run_seconds``
line of :func:`for_failure` (one credit per 100 s of a slot)."""
WORK_LINES: Final = {"page": "pages", "media_second": "media_seconds", "megapixel": "megapixels"}
"""The charge line of each ``processing_profiles.work_unit``."""


def input_fault(error_code: str | None, killed: str) -> bool:
    """Whether a sandbox run that ended with ``error_code``, stopped by ``killed`` (the sandbox's
    kill reason, empty when the child failed on its own), is the input's fault (:data:`INPUT_FAULTS`;
    a ``TIMEOUT`` only by ``cpu_time``)."""
    if error_code == "TIMEOUT":
        return killed == "cpu_time"
    return error_code in INPUT_FAULTS


@dataclass(frozen=True)
class Charge:
    """What a job is charged: ``actual`` millicredits in all, ``lines`` of it by name (the rest
    is the ``base`` line)."""

    actual: int
    lines: dict[str, int] = field(default_factory=dict)


def pages(metadata: Iterable[Mapping[str, Any]]) -> int:
    """The distinct page numbers the outputs' metadata report: each output's ``page`` (a
    preview's) and the numbers in its ``pages`` (an OCR result's list of page numbers)."""
    seen: set[int] = set()
    for meta in metadata:
        page = meta.get("page")
        if isinstance(page, int) and not isinstance(page, bool):
            seen.add(page)
        listed = meta.get("pages")
        if isinstance(listed, list):
            seen.update(p for p in listed if isinstance(p, int) and not isinstance(p, bool))
    return len(seen)


def media_seconds(metadata: Iterable[Mapping[str, Any]]) -> float:
    """The seconds of media the outputs report written: the sum of each output's
    ``duration_seconds`` (a rendition's or an audio file's; HLS playlists and fragments of a
    rendition report none, so a rendition counts once). A duration past
    :data:`hypermedia.jobs.facts.MAX_MEDIA_SECONDS` is a hostile child's word and not counted (a
    sum of such would overflow to infinity)."""
    return sum(facts.duration(meta.get("duration_seconds")) or 0.0 for meta in metadata)


def megapixels(metadata: Iterable[Mapping[str, Any]]) -> float:
    """The megapixels of the source image the outputs report read: the largest
    ``source_width`` × ``source_height`` / 10⁶ among them (every output of an image job reports
    the one source it read; :func:`hypermedia.engines.imaging.ops.run`), each side bounded as
    :func:`hypermedia.jobs.facts.of` bounds it (a hostile child's word). 0 when none reports both."""
    return _pixels(metadata) / 1_000_000


def _pixels(metadata: Iterable[Mapping[str, Any]]) -> int:
    found = facts.of(metadata)
    return int(found.get("width", 0)) * int(found.get("height", 0))


def for_completion(
    *, price: int, base_cost: int, work_unit: str | None, per_unit: int, metadata: Iterable[Mapping[str, Any]]
) -> Charge:
    """The charge of a completed job whose profile prices ``work_unit`` (None: priced by size) at
    ``per_unit`` millicredits, from its outputs' ``metadata``, ``price`` being what it held
    without allowances (``processing_jobs.estimated_credits``); a fraction of a millicredit is
    rounded up. A unit this module does not measure (a profile of a newer release, read by an
    older worker during a rollout) is charged the price, with a warning."""
    if work_unit is None:
        return Charge(price)
    if work_unit == "page":
        work_millicredits = per_unit * pages(metadata)
    elif work_unit == "media_second":
        # 0.1 s × 3 is 0.3, not 0.30000000000000004
        work_millicredits = math.ceil(round(per_unit * media_seconds(metadata), 6))
    elif work_unit == "megapixel":
        work_millicredits = -(-per_unit * _pixels(metadata) // 1_000_000)
    else:
        log.warning("no measure of work unit %r (a newer release's profile): charged the price", work_unit)
        return Charge(price)
    base = min(base_cost, price)
    work = min(work_millicredits, price - base)
    return Charge(base + work, {WORK_LINES[work_unit]: work} if work else {})


def for_failure(*, price: int, base_cost: int, run_ms: int) -> Charge:
    """The charge of a job that failed with one of :data:`INPUT_FAULTS` after its child ran for
    ``run_ms`` milliseconds in all: ``base_cost`` and ``run_seconds``, within ``price``."""
    base = min(base_cost, price)
    run = min(RUN_SECOND_MILLICREDITS * math.ceil(max(run_ms, 0) / 1000), price - base)
    return Charge(base + run, {"run_seconds": run} if run else {})
