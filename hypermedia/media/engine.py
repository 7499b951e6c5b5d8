"""The mediaworker's sandbox entry: ``run(operation, params, input_path, out_dir, *, limits)``
dispatches to the module of each media operation (:data:`OPERATION_ENTRIES`). Importing it imports
PyAV (fork-safe: importing ``av`` starts no thread) and every operation module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from hypermedia.errors import InvalidArgument
from hypermedia.media import poster, probe, waveform
from hypermedia.media.probe import MediaLimits
from hypermedia.sandbox import OutputFile

__all__ = ["OPERATION_ENTRIES", "MediaLimits", "run"]

OPERATION_ENTRIES: Final[dict[str, Callable[..., list[OutputFile]]]] = {
    "probe": probe.run,
    "waveform": waveform.run,
    "poster": poster.run,
}
"""Operation → its entry, each ``fn(operation, params, input_path, out_dir, *, limits)``."""


def run(
    operation: str, params: dict, input_path: Path, out_dir: Path, *, limits: MediaLimits
) -> list[OutputFile]:
    """Runs one media operation (see the module of each in :data:`OPERATION_ENTRIES`).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``; and whatever the operation's entry raises.
    """
    entry = OPERATION_ENTRIES.get(operation)
    if entry is None:
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    return entry(operation, params, input_path, out_dir, limits=limits)
