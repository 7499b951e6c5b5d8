"""Each operation's params schema (:data:`hypermedia.engines.schemas.PARAMS_SCHEMAS`, served by
``GET /v1/operations``) judges params as the platform does: for every example below, the schema
(``jsonschema.Draft202012Validator``) accepts it exactly when the operation's validator returns
without ``InvalidArgument``. The validators are the real ones: the four engines'
``validate_params`` and, for ``noop``, the gateway's own check (:class:`JobCreation`).

The examples of :data:`ALSO_CHECKED` are the exception the schemas declare: rules JSON Schema
cannot state (a pixel product, distinct pages or languages, page numbers inside a string, ``64.0``
for an integer, the installed OCR languages), which each schema's description lists after "Also
checked:". There the schema accepts and the validator refuses; never the reverse."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from hypermedia.api.storage.v1 import storage_pb2
from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.documents import params as document_params
from hypermedia.engines.imaging import ops as image_ops
from hypermedia.engines.imaging import params as image_params
from hypermedia.engines.media import params as media_params
from hypermedia.engines.ocr import params as ocr_params
from hypermedia.engines.schemas import DIALECT, NOOP, PARAMS_SCHEMAS, common
from hypermedia.engines.schemas import imaging as image_schemas
from hypermedia.engines.schemas import media as media_schemas
from hypermedia.jobs import noop
from services.gateway.creation import JobCreation
from services.gateway.process_request import parse_operations

Validate = Callable[[str, Any], dict]


def _noop_params(operation: str, params: Any) -> dict:
    """What the gateway makes of ``noop``'s params: the request's operation parsed, then its params
    checked as :meth:`JobCreation._params` checks them for ``noop`` (on the images queue, no
    validator of its own: ``{}`` only)."""
    [op] = parse_operations([{"name": operation, "params": params}])
    return JobCreation._params(op, {"queue": "images"}, storage_pb2.Object(), [])  # type: ignore[arg-type]


VALIDATORS: dict[str, Validate] = {
    **dict.fromkeys(image_params.OPERATIONS, image_ops.validate_params),
    **dict.fromkeys(document_params.OPERATIONS, document_params.validate_params),
    **dict.fromkeys(media_params.OPERATIONS, media_params.validate_params),
    **dict.fromkeys(
        ocr_params.OPERATIONS, functools.partial(ocr_params.validate_params, installed_languages=None)
    ),
    noop.OPERATION: _noop_params,
}
"""Operation → the function that normalises its params or raises InvalidArgument."""

EIGHT_LANGUAGES = ["eng", "deu", "fra", "ita", "spa", "por", "nld", "pol"]
SIX_HEIGHTS = [2160, 1440, 1080, 720, 480, 360]

VALID: dict[str, list[dict[str, Any]]] = {
    "thumbnail": [{}, {"size": None}, {"size": 256}, {"size": 1}, {"size": 4096}, {"size": 100}],
    "resize": [
        {"width": 1},
        {"height": 1},
        {"width": 16384},
        {"height": 16384},
        {"width": 800, "height": 600},
        {"width": 800, "height": None},
        {"width": None, "height": 600},
        {"width": 800, "fit": "contain"},
        {"height": 600, "fit": None},
        {"width": 800, "height": 600, "fit": "cover"},
        {"width": 800, "height": 600, "fit": "fill"},
        {"width": 800, "format": "jpeg"},
        {"width": 800, "format": "png"},
        {"width": 800, "format": "webp"},
        {"width": 800, "format": "avif"},
        {"width": 800, "format": None},
        {"width": 16384, "height": 16384},  # contain: no pixel limit at creation
        {"width": 10000, "height": 10000, "fit": "fill"},  # exactly 100,000,000 pixels
        {"width": 16384, "height": 6103, "fit": "cover"},
    ],
    "compress": [{}, {"quality": None}, {"quality": 75}, {"quality": 1}, {"quality": 100}],
    "convert": [
        {"format": "jpeg"},
        {"format": "png"},
        {"format": "webp"},
        {"format": "avif"},
        {"format": "jpeg", "quality": 1},
        {"format": "webp", "quality": 100},
        {"format": "avif", "quality": None},
    ],
    "pdf_info": [{}],
    "text_extract": [{}],
    "office_to_pdf": [{}],
    "pdf_preview": [
        {},
        {"pages": None, "width": None, "dpi": None, "format": None},
        {"pages": [1]},
        {"pages": [10000]},
        {"pages": list(range(1, 21))},
        {"pages": [3, 1, 3]},
        {"pages": [1] * 25},  # 25 items, one page
        {"pages": "1"},
        {"pages": "1-20"},
        {"pages": " 1 - 3 , 5,7-8 "},
        {"pages": "10000"},
        {"pages": "0001"},
        {"pages": "1-3\n"},
        {"width": 16},
        {"width": 4096},
        {"dpi": 18},
        {"dpi": 600},
        {"dpi": 96},
        {"width": 800, "dpi": None},
        {"width": None, "dpi": 72},
        {"format": "webp"},
        {"format": "png"},
        {"format": "jpeg"},
    ],
    "ocr": [
        {},
        {
            "languages": None,
            "pages": None,
            "outputs": None,
            "table_detection": None,
            "skip_text_pages": None,
            "escalate": None,
        },
        {"languages": ["eng"]},
        {"languages": "eng"},
        {"languages": "eng+deu"},
        {"languages": ["chi_sim", "script/Latin", "deu_latf"]},
        {"languages": "script/Latin+eng"},
        {"languages": EIGHT_LANGUAGES},
        {"languages": "+".join(EIGHT_LANGUAGES)},
        {"languages": ["eng"] * 9},  # nine items, one language
        {"languages": "eng+eng"},
        {"languages": ["a" + "b" * 31]},  # the longest code
        {"languages": ["ab"]},  # the shortest
        {"pages": [1]},
        {"pages": [10000]},
        {"pages": list(range(1, 21))},
        {"pages": "1-20"},
        {"pages": "2,4-6"},
        {"outputs": ["text"]},
        {"outputs": ["words"]},
        {"outputs": ["hocr"]},
        {"outputs": ["searchable_pdf"]},
        {"outputs": ["tables"]},
        {"outputs": ["text", "words", "hocr", "searchable_pdf", "tables"]},
        {"outputs": ["words", "text", "text"]},
        {"table_detection": True},
        {"table_detection": False},
        {"outputs": ["text"], "table_detection": True},
        {"skip_text_pages": True},
        {"skip_text_pages": False},
        {"escalate": True},
        {"escalate": False},
    ],
    "probe": [{}],
    "waveform": [
        {},
        {"buckets_per_second": None, "buckets": None, "channels": None, "image": None},
        {"buckets_per_second": 1},
        {"buckets_per_second": 1000},
        {"buckets_per_second": 100},
        {"buckets": 16},
        {"buckets": 100000},
        {"buckets": 64, "buckets_per_second": None},
        {"buckets_per_second": 50, "buckets": None},
        {"channels": "all"},
        {"channels": "mix"},
        {"image": True},
        {"image": False},
        {"image": {}},
        {"image": {"width": 64, "height": 32}},
        {"image": {"width": 8192, "height": 2048}},
        {"image": {"width": 1800, "height": 280, "color": "#3B82F6", "background": "transparent"}},
        {"image": {"color": "#abcdef"}},
        {"image": {"background": "#000000"}},
        {"image": {"background": "#FfFfFf"}},
        {"image": {"width": None, "height": None, "color": None, "background": None}},
    ],
    "poster": [
        {},
        {"width": None, "format": None, "quality": None, "sprite": None},
        {"width": 16},
        {"width": 3840},
        {"width": 640},
        {"format": "jpeg"},
        {"format": "webp"},
        {"format": "png"},
        {"quality": 1},
        {"quality": 100},
        {"quality": 82},
        {"sprite": False},
        {"sprite": True},
        {"sprite": {}},
        {"sprite": {"count": 4, "columns": 1, "width": 32}},
        {"sprite": {"count": 400, "columns": 20, "width": 480}},
        {"sprite": {"count": 60, "columns": 10, "width": 160}},
        {"sprite": {"count": None, "columns": None, "width": None}},
    ],
    "transcode_video": [
        {},
        {
            "codec": None,
            "heights": None,
            "quality": None,
            "preset": None,
            "audio_bitrate": None,
            "hls": None,
            "hls_segment_seconds": None,
        },
        {"codec": "h264"},
        {"codec": "vp9"},
        {"codec": "av1"},
        {"heights": [144]},
        {"heights": [2160]},
        {"heights": [360, 1080]},
        {"heights": SIX_HEIGHTS},
        {"heights": [1080, 720, 480, 360]},
        {"quality": 0},
        {"quality": 51},
        {"quality": 23},
        {"codec": None, "quality": 51},
        {"codec": "h264", "quality": 0},
        {"codec": "vp9", "quality": 0},
        {"codec": "vp9", "quality": 63},
        {"codec": "vp9", "quality": 52},
        {"codec": "av1", "quality": 1},
        {"codec": "av1", "quality": 63},
        *({"preset": preset} for preset in media_params.X264_PRESETS),
        {"codec": "h264", "preset": "veryslow"},
        {"codec": "vp9", "preset": None},
        {"codec": "av1", "preset": None, "hls": None},
        {"audio_bitrate": 32},
        {"audio_bitrate": 320},
        {"audio_bitrate": 128},
        {"hls": True},
        {"hls": False},
        {"hls": True, "codec": "h264"},
        {"hls": True, "hls_segment_seconds": 2},
        {"hls": True, "hls_segment_seconds": 10},
        {"hls": True, "hls_segment_seconds": 6},
        {"hls": True, "hls_segment_seconds": None},
        {"hls": False, "hls_segment_seconds": None},
        {"codec": "vp9", "hls": False},
        {"hls_segment_seconds": None},
    ],
    "transcode_audio": [
        {},
        {"format": None, "bitrate": None, "channels": None, "loudness": None},
        {"format": "aac"},
        {"format": "mp3"},
        {"format": "opus"},
        {"bitrate": 32},
        {"bitrate": 320},
        {"bitrate": 128},
        {"channels": 1},
        {"channels": 2},
        {"loudness": False},
        {"loudness": True},
        {"loudness": {}},
        {"loudness": {"target_lufs": -36, "true_peak_db": -9}},
        {"loudness": {"target_lufs": -10, "true_peak_db": 0}},
        {"loudness": {"target_lufs": -23.0, "true_peak_db": -1.0}},
        {"loudness": {"target_lufs": -16.5}},
        {"loudness": {"true_peak_db": -1.5}},
        {"loudness": {"target_lufs": None, "true_peak_db": None}},
    ],
    NOOP: [{}],
}
"""Params both the schema and the validator accept: ``{}`` where the defaults make it valid, each
default (also given as null), each bound, each choice."""

INVALID: dict[str, list[Any]] = {
    "thumbnail": [
        {"size": 0},
        {"size": 4097},
        {"size": -1},
        {"size": True},
        {"size": "256"},
        {"size": 25.5},
        {"size": [256]},
        {"width": 100},
        {"size": 256, "extra": 1},
    ],
    "resize": [
        {},  # neither width nor height
        {"width": None, "height": None},
        {"fit": "contain"},
        {"format": "png"},
        {"width": 0},
        {"height": 0},
        {"width": 16385},
        {"height": 16385},
        {"width": True},
        {"height": False},
        {"width": "800"},
        {"width": 800, "fit": "cover"},  # cover needs both
        {"height": 600, "fit": "fill"},  # fill needs both
        {"width": 800, "height": None, "fit": "cover"},
        {"width": 800, "fit": "stretch"},
        {"width": 800, "fit": "CONTAIN"},
        {"width": 800, "fit": True},
        {"width": 800, "format": "gif"},
        {"width": 800, "format": "jpg"},
        {"width": 800, "size": 3},
    ],
    "compress": [
        {"quality": 0},
        {"quality": 101},
        {"quality": True},
        {"quality": False},
        {"quality": "75"},
        {"quality": 7.5},
        {"format": "png"},
    ],
    "convert": [
        {},  # format is required
        {"format": None},
        {"quality": 80},
        {"format": "gif"},
        {"format": "JPEG"},
        {"format": 1},
        {"format": "png", "quality": 0},
        {"format": "png", "quality": 101},
        {"format": "png", "quality": True},
        {"format": "png", "size": 1},
    ],
    "pdf_info": [{"pages": [1]}, {"password": "secret"}, {"x": None}],
    "text_extract": [{"format": "json"}, {"password": "secret"}, {"x": None}],
    "office_to_pdf": [{"format": "pdf"}, {"password": "secret"}, {"x": None}],
    "pdf_preview": [
        {"pages": []},
        {"pages": ""},
        {"pages": [0]},
        {"pages": [10001]},
        {"pages": [True]},
        {"pages": ["1"]},
        {"pages": [1.5]},
        {"pages": 1},
        {"pages": True},
        {"pages": {"from": 1}},
        {"pages": "1-"},
        {"pages": "-3"},
        {"pages": "a"},
        {"pages": "1;2"},
        {"pages": "1,,2"},
        {"pages": "1-2-3"},
        {"pages": "1234567890"},  # ten digits
        {"width": 15},
        {"width": 4097},
        {"width": True},
        {"width": "800"},
        {"dpi": 17},
        {"dpi": 601},
        {"dpi": True},
        {"width": 800, "dpi": 72},  # not both
        {"format": "gif"},
        {"format": "WEBP"},
        {"format": False},
        {"password": "secret"},
        {"size": 1},
    ],
    "ocr": [
        {"languages": []},
        {"languages": ""},
        {"languages": "eng+"},
        {"languages": "+eng"},
        {"languages": "eng deu"},
        {"languages": "eng\n"},
        {"languages": ["eng\n"]},
        {"languages": ["e"]},
        {"languages": ["a" + "b" * 32]},
        {"languages": ["1eng"]},
        {"languages": ["../eng"]},
        {"languages": ["-l"]},
        {"languages": ["eng+deu"]},
        {"languages": ["osd"]},
        {"languages": ["eng", "equ"]},
        {"languages": "osd"},
        {"languages": "eng+osd"},
        {"languages": "equ+eng"},
        {"languages": [1]},
        {"languages": 1},
        {"languages": True},
        {"pages": []},
        {"pages": [0]},
        {"pages": [10001]},
        {"pages": "x"},
        {"pages": [False]},
        {"outputs": []},
        {"outputs": ["pdf"]},
        {"outputs": ["TEXT"]},
        {"outputs": "text"},
        {"outputs": [1]},
        {"table_detection": "yes"},
        {"table_detection": 1},
        {"skip_text_pages": 0},
        {"escalate": "false"},
        {"password": "secret"},
        {"lang": "eng"},
    ],
    "probe": [{"x": 1}, {"format": None}],
    "waveform": [
        {"buckets_per_second": 10, "buckets": 64},  # not both
        {"buckets_per_second": 0},
        {"buckets_per_second": 1001},
        {"buckets_per_second": True},
        {"buckets": 15},
        {"buckets": 100001},
        {"buckets": "64"},
        {"channels": "left"},
        {"channels": "ALL"},
        {"image": "yes"},
        {"image": 1},
        {"image": []},
        {"image": {"width": 63}},
        {"image": {"width": 8193}},
        {"image": {"height": 31}},
        {"image": {"height": 2049}},
        {"image": {"width": True}},
        {"image": {"color": "blue"}},
        {"image": {"color": "#abc"}},
        {"image": {"color": "#abcdefa"}},
        {"image": {"color": "abcdef"}},
        {"image": {"color": "#GGGGGG"}},
        {"image": {"color": "#ABCDEF\n"}},
        {"image": {"color": 0x3B82F6}},
        {"image": {"color": "transparent"}},
        {"image": {"background": "none"}},
        {"image": {"background": "Transparent"}},
        {"image": {"background": "transparent\n"}},
        {"image": {"background": "#12345"}},
        {"image": {"opacity": 1}},
        {"peaks": 1},
    ],
    "poster": [
        {"width": 15},
        {"width": 3841},
        {"width": True},
        {"width": "640"},
        {"format": "gif"},
        {"format": "JPEG"},
        {"quality": 0},
        {"quality": 101},
        {"quality": False},
        {"sprite": "yes"},
        {"sprite": 1},
        {"sprite": []},
        {"sprite": {"count": 3}},
        {"sprite": {"count": 401}},
        {"sprite": {"columns": 0}},
        {"sprite": {"columns": 21}},
        {"sprite": {"width": 31}},
        {"sprite": {"width": 481}},
        {"sprite": {"count": True}},
        {"sprite": {"rows": 2}},
        {"height": 360},
    ],
    "transcode_video": [
        {"codec": "h265"},
        {"codec": "H264"},
        {"codec": True},
        {"heights": []},
        {"heights": [143]},
        {"heights": [2161]},
        {"heights": [*SIX_HEIGHTS, 240]},  # seven
        {"heights": [720, 720]},
        {"heights": [720, 480, 720]},
        {"heights": "720"},
        {"heights": 720},
        {"heights": [True]},
        {"quality": -1},
        {"quality": 52},  # h264, the default codec
        {"codec": None, "quality": 52},
        {"codec": "h264", "quality": 52},
        {"codec": "vp9", "quality": 64},
        {"codec": "vp9", "quality": -1},
        {"codec": "av1", "quality": 0},
        {"codec": "av1", "quality": 64},
        {"quality": True},
        {"preset": "placebo"},
        {"preset": "VeryFast"},
        {"codec": "vp9", "preset": "fast"},
        {"codec": "av1", "preset": "veryfast"},
        {"audio_bitrate": 31},
        {"audio_bitrate": 321},
        {"audio_bitrate": True},
        {"hls": "true"},
        {"hls": 1},
        {"codec": "vp9", "hls": True},
        {"codec": "av1", "hls": True},
        {"hls_segment_seconds": 6},  # without hls
        {"hls": False, "hls_segment_seconds": 6},
        {"hls": None, "hls_segment_seconds": 6},
        {"hls": True, "hls_segment_seconds": 1},
        {"hls": True, "hls_segment_seconds": 11},
        {"hls": True, "hls_segment_seconds": True},
        {"crf": 23},
    ],
    "transcode_audio": [
        {"format": "wav"},
        {"format": "AAC"},
        {"bitrate": 31},
        {"bitrate": 321},
        {"bitrate": True},
        {"bitrate": "128"},
        {"channels": 0},
        {"channels": 3},
        {"channels": True},
        {"channels": "2"},
        {"loudness": "ebu"},
        {"loudness": 1},
        {"loudness": []},
        {"loudness": {"target_lufs": -36.1}},
        {"loudness": {"target_lufs": -9.9}},
        {"loudness": {"true_peak_db": -9.5}},
        {"loudness": {"true_peak_db": 0.1}},
        {"loudness": {"target_lufs": True}},
        {"loudness": {"target_lufs": "-23"}},
        {"loudness": {"lufs": -23}},
        {"sample_rate": 48000},
    ],
    NOOP: [{"x": 1}, {"size": 256}, {"x": None}],
}
"""Params both the schema and the validator refuse: unknown keys, wrong types, a boolean for an
integer, each bound crossed, a value outside a choice, a required param missing, each rule
between params broken."""

NOT_OBJECTS: list[Any] = [[], [{"size": 1}], "size=256", 1, True]
"""Params that are no object: refused by every validator (``noop``'s params never get this far:
the gateway's request parsing answers ``INVALID_REQUEST``)."""

ALSO_CHECKED: list[tuple[str, dict[str, Any], frozenset[str] | None]] = [
    # resize: the output's pixels with cover or fill.
    ("resize", {"width": 10000, "height": 10001, "fit": "fill"}, None),
    ("resize", {"width": 16384, "height": 16384, "fit": "cover"}, None),
    # pdf_preview: different pages, and the numbers inside a pages string.
    ("pdf_preview", {"pages": list(range(1, 22))}, None),
    ("pdf_preview", {"pages": "1-21"}, None),
    ("pdf_preview", {"pages": "1-10,11-21"}, None),
    ("pdf_preview", {"pages": "0"}, None),
    ("pdf_preview", {"pages": "10001"}, None),
    ("pdf_preview", {"pages": "3-1"}, None),
    # ocr: different languages and pages, page numbers inside a string, installed languages.
    ("ocr", {"languages": [*EIGHT_LANGUAGES, "swe"]}, None),
    ("ocr", {"languages": "+".join([*EIGHT_LANGUAGES, "swe"])}, None),
    ("ocr", {"pages": list(range(1, 22))}, None),
    ("ocr", {"pages": "1-21"}, None),
    ("ocr", {"pages": "5-4"}, None),
    ("ocr", {"pages": "0"}, None),
    ("ocr", {"languages": ["fra"]}, frozenset({"eng", "deu"})),
    ("ocr", {"languages": "eng+fra"}, frozenset({"eng", "deu"})),
    # An integral float for an integer, which JSON Schema's "integer" accepts.
    ("thumbnail", {"size": 256.0}, None),
    ("resize", {"width": 800.0}, None),
    ("compress", {"quality": 75.0}, None),
    ("convert", {"format": "jpeg", "quality": 80.0}, None),
    ("pdf_preview", {"dpi": 72.0}, None),
    ("pdf_preview", {"pages": [1.0]}, None),
    ("ocr", {"pages": [2.0]}, None),
    ("poster", {"width": 640.0}, None),
    ("poster", {"sprite": {"count": 60.0}}, None),
    ("transcode_video", {"quality": 23.0}, None),
    ("transcode_video", {"heights": [720.0]}, None),
    ("transcode_video", {"hls": True, "hls_segment_seconds": 6.0}, None),
    ("transcode_audio", {"channels": 2.0}, None),
    ("waveform", {"buckets": 64.0}, None),
    ("waveform", {"image": {"width": 640.0}}, None),
]
"""``(operation, params, installed OCR languages)`` the schema accepts and the validator refuses:
the rules each schema's description lists after "Also checked:"."""

BASE: dict[str, dict[str, Any]] = {"resize": {"width": 100}, "convert": {"format": "png"}}
"""The smallest valid params of the operations for which ``{}`` is not valid."""

NORMALISED_DEFAULTS: dict[tuple[str, str], Any] = {
    ("poster", "sprite"): None,
    ("transcode_audio", "loudness"): None,
}
"""Defaults the validator stores in another form: ``false`` (no group) is normalised to null."""


def _schema(operation: str) -> Draft202012Validator:
    return Draft202012Validator(PARAMS_SCHEMAS[operation])


def _accepted(operation: str, params: Any, installed: frozenset[str] | None = None) -> bool:
    """Whether the platform's validator accepts ``params``; any refusal is ``INVALID_PARAMS``."""
    try:
        if installed is not None:
            ocr_params.validate_params(operation, params, installed_languages=installed)
        else:
            VALIDATORS[operation](operation, params)
    except InvalidArgument as exc:
        assert exc.error_code == "INVALID_PARAMS", exc
        return False
    return True


def _cases(examples: dict[str, list[Any]]) -> list[Any]:
    return [
        pytest.param(op, params, id=f"{op}:{json.dumps(params)}")
        for op, items in examples.items()
        for params in items
    ]


@pytest.mark.parametrize(("operation", "params"), _cases(VALID))
def test_valid_params_pass_the_schema_and_the_validator(operation: str, params: dict[str, Any]) -> None:
    errors = [e.message for e in _schema(operation).iter_errors(params)]
    assert not errors, errors
    assert _accepted(operation, params)


@pytest.mark.parametrize(("operation", "params"), _cases(INVALID))
def test_invalid_params_fail_the_schema_and_the_validator(operation: str, params: Any) -> None:
    assert not _schema(operation).is_valid(params)
    assert not _accepted(operation, params)


@pytest.mark.parametrize("params", NOT_OBJECTS, ids=json.dumps)
@pytest.mark.parametrize("operation", sorted(set(PARAMS_SCHEMAS) - {NOOP}))
def test_params_that_are_no_object_fail_the_schema_and_the_validator(operation: str, params: Any) -> None:
    assert not _schema(operation).is_valid(params)
    assert not _accepted(operation, params)


@pytest.mark.parametrize(
    ("operation", "params", "installed"),
    [pytest.param(*case, id=f"{case[0]}:{json.dumps(case[1])}") for case in ALSO_CHECKED],
)
def test_what_the_schema_cannot_judge_is_also_checked_by_the_validator(
    operation: str, params: dict[str, Any], installed: frozenset[str] | None
) -> None:
    assert _schema(operation).is_valid(params)
    assert not _accepted(operation, params, installed)
    assert "Also checked: " in PARAMS_SCHEMAS[operation]["description"]


def test_installed_languages_are_accepted_by_both() -> None:
    installed = frozenset({"eng", "deu"})
    for params in ({"languages": "eng+deu"}, {"languages": ["deu"]}, {}):
        assert _schema("ocr").is_valid(params)
        assert _accepted("ocr", params, installed)
    assert "installed on the ocrworkers" in PARAMS_SCHEMAS["ocr"]["description"]


def test_every_operation_has_a_schema_and_no_other_has_one() -> None:
    operations = {
        *image_params.OPERATIONS,
        *document_params.OPERATIONS,
        *media_params.OPERATIONS,
        *ocr_params.OPERATIONS,
        noop.OPERATION,
    }
    assert set(PARAMS_SCHEMAS) == operations
    assert set(VALID) == set(INVALID) == operations  # every operation has examples of both


@pytest.mark.parametrize("operation", sorted(PARAMS_SCHEMAS))
def test_each_schema_is_a_valid_closed_object_schema(operation: str) -> None:
    schema = PARAMS_SCHEMAS[operation]
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == DIALECT == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == operation
    assert schema["description"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    for name, prop in _properties(schema):
        assert prop.get("description"), f"{operation}.{name} has no description"
        assert "type" in prop, f"{operation}.{name} has no type"
    # Plain JSON (the gateway serves it as JSON and as a protobuf Struct): no tuple, set or object.
    assert json.loads(json.dumps(schema)) == schema
    assert _json_types_only(schema)


def _properties(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property, the ones inside an object-valued property (``sprite.count``) too."""
    for name, prop in schema.get("properties", {}).items():
        yield prefix + name, prop
        yield from _properties(prop, f"{prefix}{name}.")


def _types(prop: dict[str, Any]) -> list[str]:
    return prop["type"] if isinstance(prop["type"], list) else [prop["type"]]


def _json_types_only(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_types_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_types_only(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


@pytest.mark.parametrize("operation", sorted(PARAMS_SCHEMAS))
def test_each_default_is_what_the_validator_fills_in(operation: str) -> None:
    """The default of every property is what the validator stores when the param is left out, and
    giving it explicitly (or giving null) changes nothing; inside a group (``sprite``, ``image``,
    ``loudness``) each setting's default is what an empty object gets."""
    schema, validate = _schema(operation), VALIDATORS[operation]
    base = BASE.get(operation, {})
    normalised = validate(operation, base)
    for name, prop in PARAMS_SCHEMAS[operation]["properties"].items():
        if name in base:
            continue
        if "null" in _types(prop):
            assert validate(operation, {**base, name: None}) == normalised, name
        if "default" not in prop:
            continue
        default = prop["default"]
        assert normalised[name] == NORMALISED_DEFAULTS.get((operation, name), default), name
        assert schema.is_valid({**base, name: default}), name
        assert validate(operation, {**base, name: default}) == normalised, name
        for setting, inner in prop.get("properties", {}).items():
            if "default" in inner:
                assert validate(operation, {**base, name: {}})[name][setting] == inner["default"], setting
                assert schema.is_valid({**base, name: {setting: inner["default"]}}), setting


def test_the_defaults_that_depend_on_another_param_are_the_validators() -> None:
    """The defaults inside a rule (``transcode_video``'s quality per codec, hls_segment_seconds
    with hls) are what the validator fills in for each valid example the rule's ``if`` matches."""
    checked = 0
    for operation, schema in PARAMS_SCHEMAS.items():
        for rule in schema.get("allOf", []):
            for branch, matches in (("then", True), ("else", False)):
                implied = rule.get(branch, {}).get("properties", {})
                for name, prop in implied.items():
                    if "default" not in prop:
                        continue
                    examples = [
                        p
                        for p in VALID[operation]
                        if Draft202012Validator(rule["if"]).is_valid(p) is matches and p.get(name) is None
                    ]
                    assert examples, (operation, rule)
                    for params in examples:
                        assert VALIDATORS[operation](operation, params)[name] == prop["default"], params
                    checked += 1
    assert checked == len(media_params.VIDEO_QUALITY) + 1  # a quality per codec, the segment length


def test_the_copied_constants_are_the_validators() -> None:
    """What the schemas copy instead of importing: the image validator imports pyvips, the engines
    may not import hypermedia.jobs, and two patterns are private to their module."""
    assert image_schemas.MAX_THUMBNAIL_SIZE == image_ops.MAX_THUMBNAIL_SIZE
    assert image_schemas.MAX_DIMENSION == image_ops.MAX_DIMENSION
    assert image_schemas.MAX_OUTPUT_PIXELS == image_ops.MAX_OUTPUT_PIXELS
    assert image_schemas.OUTPUT_FORMATS == image_ops._OUTPUT_FORMATS
    assert common.PAGE_PART == document_params._PAGE_SPEC.pattern
    assert media_schemas.COLOR == media_params._COLOR.pattern
    assert NOOP == noop.OPERATION


def test_importing_the_schemas_loads_no_native_engine() -> None:
    """The gateway imports the schemas: libvips, PyAV, PDFium and tesseract stay unloaded."""
    heavy = ("pyvips", "av", "pypdfium2", "pytesseract", "PIL")
    code = f"import sys, hypermedia.engines.schemas; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_an_empty_preset_name_is_an_unknown_preset_not_a_nameless_operation() -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_operations([{"preset": ""}])
    assert caught.value.error_code == "UNKNOWN_PRESET"
    [op] = parse_operations([{"preset": "avatar"}])
    assert (op.name, op.preset) == ("", "avatar")
