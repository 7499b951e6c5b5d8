"""A long OCR read by child jobs (issue 23 item 2, ADR 0082): what each run of an ``ocr`` job
that fans out does.

A job selecting more than :attr:`~hypermedia.engines.ocr.pages.OcrLimits.fan_out_pages` pages
is cut into groups (:func:`page_groups`); with at least :data:`MIN_GROUPS` of them, its first
run asks to fan out (:func:`hypermedia.engines.contract.fan_out_request`, each group's page
numbers) and reads nothing; the worker makes one child job per group but the last
(:mod:`hypermedia.worker.fanout`). A child reads its group and keeps every page of it as its
parent's checkpoint part (ADR 0069's page parts); the job's next run takes every kept page
and reads the others — its own last group, and any page no child kept — then writes the
outputs as one run does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hypermedia.engines.contract import OutputFile, fan_out_request
from hypermedia.engines.ocr.kept_pages import KeptPage
from hypermedia.engines.ocr.pages import OcrLimits

MIN_GROUPS: Final = 3
"""Fewest groups a job fans out into: two children beside the job's own last group
(:data:`hypermedia.worker.fanout.MIN_CHUNKS`)."""
MAX_GROUPS: Final = 60
"""Most groups of a job (:data:`hypermedia.worker.fanout.MAX_CHUNKS`)."""


def page_groups(numbers: list[int], limits: OcrLimits) -> list[list[int]]:
    """The selected pages of a job that fans out, in order, in groups of
    :attr:`OcrLimits.fan_out_group_pages` — fewer pages where that would make fewer than
    :data:`MIN_GROUPS` (a job never reads more than a group itself, however the settings are
    set), more where it would make more than :data:`MAX_GROUPS`; the last group is the job's
    own (its children read the others)."""
    size = min(limits.fan_out_group_pages, math.ceil(len(numbers) / MIN_GROUPS))
    size = max(1, size, math.ceil(len(numbers) / MAX_GROUPS))
    return [numbers[i : i + size] for i in range(0, len(numbers), size)]


@dataclass(frozen=True)
class FannedRun:
    """A run of a job whose pages are read in groups by child jobs: the request to fan out (the
    job's first run), a child's group, or the job's last run with its children's pages."""

    request: OutputFile | None = None
    read: list[int] = field(default_factory=list)
    """The pages this run reads: a child's group; the last run's, every page no child kept."""
    child: bool = False
    kept: dict[int, KeptPage] = field(default_factory=dict)
    """The last run's pages its children (or an earlier attempt) kept, by number."""


def fanned_run(
    selected: list[int], limits: OcrLimits, out_dir: Path, kept_page: Callable[[int], KeptPage | None]
) -> FannedRun | None:
    """What this run of a job selecting ``selected`` pages does when the job fans out
    (:meth:`OcrLimits.fans_out`, and at least :data:`MIN_GROUPS` groups); None when it does not:
    it reads its pages itself, resuming after kept ones (ADR 0069). ``kept_page(number)`` is
    the page an earlier run kept, or None.

    * a run that may fan out (:attr:`OcrLimits.fan_out`) asks to, writing the request into
      ``out_dir``;
    * a child's run (:attr:`OcrLimits.group`) reads its group, every page of it to be kept
      (nothing for the last group, the job's own, or a group the plan has not; nothing either
      when the plan makes no children, as when the settings changed since the job asked);
    * the job's run after its children takes every kept page and reads the others.
    """
    groups = page_groups(selected, limits) if limits.fans_out(len(selected)) else []
    if len(groups) < MIN_GROUPS:
        return None if limits.group is None else FannedRun(child=True)
    if limits.fan_out:
        return FannedRun(request=fan_out_request(out_dir, groups))
    if limits.group is not None:
        own = groups[limits.group] if 0 <= limits.group < len(groups) - 1 else []
        return FannedRun(read=own, child=True)
    kept = {number: page for number in selected if (page := kept_page(number)) is not None}
    return FannedRun(read=[n for n in selected if n not in kept], kept=kept)
