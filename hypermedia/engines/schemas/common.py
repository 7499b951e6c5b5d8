"""Builders shared by the params schemas of :mod:`hypermedia.engines.schemas`: JSON Schema
(draft 2020-12) fragments for the kinds of param the validators share, so that every schema says
the same things the same way. Pure Python, plain JSON values only (dicts, lists, strings, numbers,
booleans, None): the schemas are served as JSON and as a protobuf ``Struct``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from hypermedia.engines.documents.params import MAX_DOCUMENT_PAGES

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

NULL_IS_ABSENT: Final = "A param given as null is the same as leaving it out."

INTEGERS: Final = (
    "an integer param is a JSON integer: 64.0 is refused, although JSON Schema's integer accepts it"
)
"""The rule every validator applies to integers (``isinstance(value, int)``, never a bool) that
JSON Schema cannot state: its ``integer`` is any number with a zero fraction."""

PAGE_PART: Final = r"\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?"
"""One comma-separated part of a ``pages`` string: a page number or a range. A copy of
``hypermedia.engines.documents.params._PAGE_SPEC`` (private there; the test compares them)."""

_NO_DEFAULT: Final[Any] = object()


def whole(pattern: str) -> str:
    """``pattern`` matching a whole string, alike in ECMA-262 (JSON Schema's regex dialect) and in
    Python's ``re`` (which the ``jsonschema`` package uses): Python's ``$`` also matches before a
    final newline, which ``(?!\\n)`` rules out."""
    return f"^(?:{pattern})(?!\\n)$"


def given(*names: str) -> dict[str, Any]:
    """A schema true when every one of ``names`` is present and not null (the validators read an
    explicit null as absent)."""
    return {"required": list(names), "properties": {name: {"not": {"type": "null"}} for name in names}}


def operation(
    title: str,
    description: str,
    properties: dict[str, Any] | None = None,
    *,
    also_checked: Iterable[str] = (),
    rules: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The schema of one operation's params: a closed object of ``properties`` and ``rules`` (the
    cross-field keywords: ``anyOf``, ``allOf``, ``not``, ``if``/``then``). ``also_checked`` names
    the rules JSON Schema cannot state; the description says them, so that the schema never
    claims to accept more than it says."""
    text = description
    if properties:
        text += " " + NULL_IS_ABSENT
    checked = list(also_checked)
    if checked:
        text += " Also checked: " + "; ".join(checked) + "."
    return {
        "$schema": DIALECT,
        "title": title,
        "description": text,
        "type": "object",
        "additionalProperties": False,
        "properties": properties or {},
        **(rules or {}),
    }


def _described(schema: dict[str, Any], description: str, default: Any) -> dict[str, Any]:
    schema["description"] = description
    if default is not _NO_DEFAULT:
        schema["default"] = default
    return schema


def integer(description: str, low: int, high: int, default: Any = _NO_DEFAULT) -> dict[str, Any]:
    """An optional integer from ``low`` to ``high`` (null: absent)."""
    return _described({"type": ["integer", "null"], "minimum": low, "maximum": high}, description, default)


def number(description: str, low: float, high: float, default: Any = _NO_DEFAULT) -> dict[str, Any]:
    """An optional number (integer or fraction, never a boolean) from ``low`` to ``high``."""
    return _described({"type": ["number", "null"], "minimum": low, "maximum": high}, description, default)


def choice(
    description: str, choices: Sequence[str], default: Any = _NO_DEFAULT, *, required: bool = False
) -> dict[str, Any]:
    """One of ``choices``; null too (absent) unless ``required``."""
    if required:
        return _described({"type": "string", "enum": list(choices)}, description, default)
    return _described({"type": ["string", "null"], "enum": [*choices, None]}, description, default)


def flag(description: str, default: bool) -> dict[str, Any]:
    """An optional boolean."""
    return _described({"type": ["boolean", "null"]}, description, default)


def group(description: str, properties: dict[str, Any], default: Any) -> dict[str, Any]:
    """An optional group of settings: ``false`` (none), ``true`` (every setting's default) or a
    closed object of ``properties``, each defaulting on its own."""
    return _described(
        {"type": ["boolean", "object", "null"], "additionalProperties": False, "properties": properties},
        description,
        default,
    )


def pages(description: str, default: Any) -> dict[str, Any]:
    """``pages`` as :func:`hypermedia.engines.documents.params.parse_pages` reads it: a non-empty
    list of page numbers, or a string of numbers and ranges (``"1-3"``, ``"1,4,6-8"``)."""
    return _described(
        {
            "type": ["array", "string", "null"],
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_DOCUMENT_PAGES},
            "minItems": 1,
            "pattern": whole(f"{PAGE_PART}(?:,{PAGE_PART})*"),
        },
        description,
        default,
    )
