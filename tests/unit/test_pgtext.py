"""The one rule for request strings (hypermedia.core.pgtext): what it refuses and how it names the field."""

from __future__ import annotations

from typing import Any

import pytest

from hypermedia.api.jobs.v1 import jobs_pb2
from hypermedia.core import pgtext


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ({"operations": ["ok", "a\x00", "b\x00"]}, "operations[1]", "holds a NUL"),
        ({"a": {"x": "\ud800"}, "b": "\x00"}, "a.x", "lone surrogate"),
        ({"a b": [1, {"k\x00": 2}]}, '["a b"][1]', "has a key that holds a NUL"),
        ({"\udfff": 1}, "the body", "has a key that holds a lone surrogate"),
        ({"k" * 100: "\x00"}, '["' + "k" * 64 + '…"]', "holds a NUL"),  # a long key is cut
    ],
    ids=["list", "nested", "bad-key", "bad-root-key", "long-key"],
)
def test_check_json_names_the_first_bad_string_by_its_path(value: Any, field: str, message: str) -> None:
    with pytest.raises(pgtext.InvalidText) as caught:
        pgtext.check_json(value)
    assert caught.value.field == field
    assert caught.value.public_message.startswith(f"{field} ") and message in caught.value.public_message
    assert (caught.value.error_code, caught.value.details) == ("INVALID_REQUEST", {"field": field})


def test_check_bounds_and_passes_good_text() -> None:
    pgtext.check(None, "k", 1)
    pgtext.check("é" * 200, "idempotency_key", 200)
    pgtext.check_json({"naïve": ["日本語", 1, None, True]})
    with pytest.raises(pgtext.InvalidText, match=r"^idempotency_key may be at most 200 characters$"):
        pgtext.check("k" * 201, "idempotency_key", 200)


def test_check_message_walks_structs_lists_maps_and_skips_what_it_is_told() -> None:
    op = jobs_pb2.Operation(name="ocr")
    op.params.update({"languages": ["eng", "de\x00u"]})
    with pytest.raises(pgtext.InvalidText) as caught:
        pgtext.check_message(jobs_pb2.ProcessRequest(operations=[jobs_pb2.Operation(name="x"), op]))
    assert caught.value.field == "operations[1].params.languages[1]"
    with pytest.raises(pgtext.InvalidText) as caught:
        pgtext.check_message(jobs_pb2.Job(charge_lines={"base": "1\x00"}))
    assert caught.value.field == 'charge_lines["base"]'
    request = jobs_pb2.UploadObjectRequest(content=b"\x00\x00", filename="a\x00")
    with pytest.raises(pgtext.InvalidText):
        pgtext.check_message(request)
    pgtext.check_message(request, frozenset({"hypermedia.jobs.v1.UploadObjectRequest.filename"}))
