"""One rule for every string a request can bring to Postgres (ADR 0030).

Postgres ``text`` and ``jsonb`` refuse NUL (U+0000: "invalid byte sequence for encoding UTF8:
0x00", "unsupported Unicode escape sequence"), no UTF-8 encoder (asyncpg, httpx, the JSON of an
error answer) takes a lone surrogate (U+D800–U+DFFF, which a JSON ``\\ud800`` escape decodes to),
and a btree index refuses an entry above about 2,700 bytes. Each of these reached Postgres from a
request and ended as 500/INTERNAL. Here they are refused once, as :class:`InvalidText`
(422 ``INVALID_REQUEST`` / ``INVALID_ARGUMENT``) naming the field:

- :func:`check`: one string field with its length bound (the ``MAX_*_LENGTH`` constants);
- :func:`check_json`: every key and string of a parsed JSON value (a REST body, job params);
- :func:`check_message`: every string of a protobuf message, ``Struct`` keys and values
  included, and every number of a ``Struct`` (NaN and ±Infinity, which a double on the wire may
  hold and JSON may not); the gRPC error interceptor runs it on each request of every service.

gRPC strings are UTF-8 on the wire, so only NUL can arrive there; lengths are per field and stay
with the code that knows the field (:mod:`services.gateway.process_request`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from hypermedia.core.errors import InvalidArgument

MAX_IDEMPOTENCY_KEY_LENGTH = 200
"""Longest idempotency key (characters), REST header and gRPC field alike."""
MAX_OPERATION_NAME_LENGTH = 64
"""Longest operation name (characters); profile names are short words such as ``thumbnail``."""
MAX_PARAMS_BYTES = 16 * 1024
"""Largest params of one operation, as compact JSON (bytes); the largest valid params (a media
ladder, a list of OCR languages) are under 1 KiB."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a JSON request body or a params value may have (levels,
the body's own object being 1): the deepest valid body (params holding a list of ladder rungs) is
4 levels. Python's parser gives up near 1,000 levels (its recursion limit) with an error that said
nothing of why."""
DEPTH_PROBLEM = f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
_SHOWN_KEY_LENGTH = 64
"""How much of a JSON key a field path shows (characters)."""


class InvalidText(InvalidArgument):
    """A string of the request that Postgres (or UTF-8) would refuse, or one above its field's
    length bound. ``field`` names it as the request spells it (``operations[0].name``,
    ``idempotency_key``, ``operations[1].params.languages[0]``); REST answers carry it as the
    problem's ``field`` member, gRPC in the status message."""

    default_code = "INVALID_REQUEST"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}", "INVALID_REQUEST")
        self.field = field

    @property
    def details(self) -> dict[str, str]:
        """``{"field": …}``."""
        return {"field": self.field}


_NUL = "holds a NUL character (U+0000), which Postgres text refuses"


def problem(value: str) -> str | None:
    """Why Postgres or a UTF-8 encoder would refuse ``value``, or None when it is fine."""
    if "\x00" in value:
        return _NUL
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone surrogate (U+D800–U+DFFF): not valid Unicode"
    return None


def check(value: str | None, field: str, max_length: int) -> None:
    """Raises InvalidText unless ``value`` (None passes) is at most ``max_length`` characters
    without NUL or lone surrogates."""
    if value is None:
        return
    reason = problem(value)
    if reason is not None:
        raise InvalidText(field, reason)
    if len(value) > max_length:
        raise InvalidText(field, f"may be at most {max_length} characters")


def _member(path: str, key: str) -> str:
    shown = key if len(key) <= _SHOWN_KEY_LENGTH else key[:_SHOWN_KEY_LENGTH] + "…"
    if shown.isidentifier():
        return f"{path}.{shown}" if path else shown
    return f"{path}[{json.dumps(shown, ensure_ascii=False)}]"


def check_json(value: Any, field: str = "") -> None:
    """Raises InvalidText for the first key or string of a parsed JSON value that :func:`problem`
    refuses. ``field`` is the value's own path (``""`` for a request body's root): a bad string
    is named by its path (``operations[0].params.format``), a bad key by its object's
    (``operations[0].params``, "has a key that …"); a value nested deeper than
    :data:`MAX_JSON_DEPTH` by the path of the first container past that depth."""
    stack: list[tuple[str, Any, int]] = [(field, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, dict | list) and depth >= MAX_JSON_DEPTH:
            raise InvalidText(path or "the body", DEPTH_PROBLEM)
        if isinstance(item, str):
            reason = problem(item)
            if reason is not None:
                raise InvalidText(path or "the body", reason)
        elif isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and (reason := problem(key)) is not None:
                    raise InvalidText(path or "the body", f"has a key that {reason}")
            # Reversed onto the stack, so the first bad string in document order is the one named.
            stack.extend((_member(path, str(key)), inner, depth + 1) for key, inner in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", inner, depth + 1) for i, inner in reversed(list(enumerate(item))))


def json_size(value: Any) -> int:
    """The size of ``value`` as compact UTF-8 JSON (bytes). ``value`` must have passed
    :func:`check_json` (a lone surrogate does not encode)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


_WALKED = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE})
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"
_LIST_VALUE = "google.protobuf.ListValue"


def check_message(message: Message, skip: frozenset[str] = frozenset()) -> None:
    """Raises InvalidText for the first string of ``message`` (nested messages, repeated fields,
    maps, ``Struct`` keys and values) that holds a NUL, or the first ``Struct`` number that is
    not finite. Fields whose full name is in ``skip``
    (``pkg.Message.field``) are not looked at: strings the service sanitises instead of storing."""
    _walk(message, "", skip)


def _walk(message: Message, path: str, skip: frozenset[str]) -> None:
    name = message.DESCRIPTOR.full_name
    if name == _STRUCT:
        for key, value in message.fields.items():  # type: ignore[attr-defined]
            if "\x00" in key:
                raise InvalidText(path, f"has a key that {_NUL}")
            _walk(value, _member(path, key), skip)
        return
    if name == _VALUE:
        kind = message.WhichOneof("kind")
        if kind == "string_value":
            _string(message.string_value, path)  # type: ignore[attr-defined]
        elif kind == "number_value" and not math.isfinite(message.number_value):  # type: ignore[attr-defined]
            # A double on the wire may be NaN or ±Infinity; JSON (and jsonb) has neither, and
            # json_format refuses to convert it (a ValueError: INTERNAL before this check).
            raise InvalidText(path, "is not a finite number (NaN and Infinity are not JSON)")
        elif kind in ("struct_value", "list_value"):
            _walk(getattr(message, kind), path, skip)
        return
    if name == _LIST_VALUE:
        for i, value in enumerate(message.values):  # type: ignore[attr-defined]
            _walk(value, f"{path}[{i}]", skip)
        return
    # By descriptor, not ListFields(): that would copy every bytes field (91 ms for a 64 MiB
    # UploadObject, measured), and bytes are never looked at here.
    for field in message.DESCRIPTOR.fields:
        if field.type not in _WALKED or field.full_name in skip:
            continue
        if field.is_repeated:
            value = getattr(message, field.name)
            if not value:
                continue
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if not message.HasField(field.name):
                continue
            value = getattr(message, field.name)
        else:
            value = getattr(message, field.name)
        here = f"{path}.{field.name}" if path else field.name
        if field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                for i, item in enumerate(value):
                    _string(item, f"{here}[{i}]")
            else:
                _string(value, here)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                key_field, value_field = entry.fields
                for key, item in value.items():
                    if key_field.type == FieldDescriptor.TYPE_STRING and "\x00" in key:
                        raise InvalidText(here, f"has a key that {_NUL}")
                    if value_field.type == FieldDescriptor.TYPE_STRING:
                        _string(item, f"{here}[{json.dumps(key)}]")
                    elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        _walk(item, f"{here}[{json.dumps(key)}]", skip)
            elif field.is_repeated:
                for i, item in enumerate(value):
                    _walk(item, f"{here}[{i}]", skip)
            else:
                _walk(value, here, skip)


def _string(value: str, path: str) -> None:
    if "\x00" in value:
        raise InvalidText(path, _NUL)
