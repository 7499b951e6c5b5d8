"""Normalised params validate again to themselves, for every operation of every queue: the
gateway stores the normalised params on the job and the worker validates them once more before it
runs the job (issue 15, item 10: ``waveform`` with ``"image": false`` was stored as ``null``, which
the worker's second validation read as "absent", the defaults, and made a PNG after all). Booleans
and optional groups are given as false, true and objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hypermedia.engines.documents import params as document_params
from hypermedia.engines.imaging import ops as image_ops
from hypermedia.engines.media import params as media_params
from hypermedia.engines.ocr import params as ocr_params

Validate = Callable[[str, Any], dict]

CASES: list[tuple[Validate, str, Any]] = [
    (image_ops.validate_params, "thumbnail", None),
    (image_ops.validate_params, "thumbnail", {"size": 64}),
    (image_ops.validate_params, "resize", {"width": 100, "height": 50, "fit": "cover"}),
    (image_ops.validate_params, "compress", {"quality": 40}),
    (image_ops.validate_params, "convert", {"format": "avif"}),
    (document_params.validate_params, "pdf_info", None),
    (document_params.validate_params, "pdf_preview", {"pages": [1, 3], "dpi": 72, "format": "png"}),
    (document_params.validate_params, "pdf_preview", {"width": 300}),
    (document_params.validate_params, "text_extract", None),
    (document_params.validate_params, "office_to_pdf", None),
    (ocr_params.validate_params, "ocr", None),
    (
        ocr_params.validate_params,
        "ocr",
        {"escalate": False, "table_detection": True, "skip_text_pages": True},
    ),
    (
        ocr_params.validate_params,
        "ocr",
        {"escalate": True, "table_detection": False, "languages": ["eng", "deu"]},
    ),
    (media_params.validate_params, "probe", None),
    (media_params.validate_params, "waveform", None),
    (media_params.validate_params, "waveform", {"image": False}),
    (media_params.validate_params, "waveform", {"image": True, "channels": "mix"}),
    (media_params.validate_params, "waveform", {"image": {"width": 640, "color": "#abcdef"}, "buckets": 64}),
    (media_params.validate_params, "poster", {"sprite": False}),
    (media_params.validate_params, "poster", {"sprite": True, "format": "webp"}),
    (media_params.validate_params, "poster", {"sprite": {"count": 8, "columns": 4}}),
    (media_params.validate_params, "transcode_video", {"hls": True, "heights": [360, 240]}),
    (media_params.validate_params, "transcode_video", {"hls": False, "codec": "vp9"}),
    (media_params.validate_params, "transcode_audio", {"loudness": False}),
    (media_params.validate_params, "transcode_audio", {"loudness": True, "format": "opus"}),
    (media_params.validate_params, "transcode_audio", {"loudness": {"target_lufs": -16}}),
]


@pytest.mark.parametrize(
    ("validate", "operation", "params"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_normalised_params_validate_again_to_themselves(
    validate: Validate, operation: str, params: Any
) -> None:
    once = validate(operation, params)
    assert validate(operation, once) == once


def test_a_waveform_without_an_image_stays_without_one_after_the_second_validation() -> None:
    stored = media_params.validate_params("waveform", {"image": False})
    assert stored["image"] is False
    assert media_params.validate_params("waveform", stored)["image"] is False
    assert media_params.validate_params("waveform", {})["image"]["width"] == 1800  # absent: defaults
