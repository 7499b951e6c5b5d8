"""Params of the media operations (issue 7): checked when a job is created (the gateway) and again
in the worker (:func:`hypermedia.media.probe.run`). Pure Python: the gateway imports this module,
never PyAV.

| operation | params |
|---|---|
| ``probe`` | none: ``{}`` or ``null``; any key is ``INVALID_PARAMS`` |
"""

from __future__ import annotations

from typing import Any, Final

from hypermedia.jobparams import params_object

__all__ = ["OPERATIONS", "validate_params"]

OPERATIONS: Final = ("probe",)
"""The media operations this package implements so far (``transcode_video``, ``transcode_audio``,
``poster`` and ``waveform`` are to come)."""

_ALLOWED_KEYS: Final[dict[str, frozenset[str]]] = {"probe": frozenset()}


def validate_params(operation: str, params: Any) -> dict[str, Any]:
    """The params of one media operation, normalised.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: the request's params: a mapping, or ``None`` for none.

    Returns:
        ``{}`` for ``probe``.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an operation not in :data:`OPERATIONS`;
            ``INVALID_PARAMS`` for params that are not an object or that have unknown keys.
    """
    params_object(operation, params, OPERATIONS, _ALLOWED_KEYS.get(operation, ()))
    return {}
