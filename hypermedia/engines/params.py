"""What every operation's params check starts with (the gateway's and the worker's alike). Pure
Python: the gateway imports it."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hypermedia.core.errors import InvalidArgument


def params_object(
    operation: str, params: Any, operations: Collection[str], allowed_keys: Collection[str]
) -> Mapping[str, Any]:
    """``params`` as a mapping (``None`` → ``{}``) after the checks every operation shares.

    Args:
        operation: the operation asked for. params: the request's ``params``, any JSON value.
        operations: the operations of the caller's module. allowed_keys: the keys ``operation`` takes.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an operation not in ``operations``;
            ``INVALID_PARAMS`` for params that are not an object, or that have keys outside
            ``allowed_keys`` (all of them named, sorted).
    """
    if operation not in operations:
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidArgument("params must be an object", "INVALID_PARAMS")
    unknown = sorted(str(key) for key in params if key not in allowed_keys)
    if unknown:
        raise InvalidArgument(f"unknown params for {operation}: {', '.join(unknown)}", "INVALID_PARAMS")
    return params
