"""``--op`` of ``hypermedia submit`` (issue 22 item 5): names, key=value params read as JSON where
they parse, presets and JSON objects; anything else refused with what is wrong."""

from __future__ import annotations

import pytest

from hypermedia.client.commands import parse_op


@pytest.mark.parametrize(
    ("spec", "operation"),
    [
        ("thumbnail", "thumbnail"),
        ("thumbnail:size=128", {"name": "thumbnail", "params": {"size": 128}}),
        ("convert:format=avif,quality=60", {"name": "convert", "params": {"format": "avif", "quality": 60}}),
        ("transcode_video:hls=true", {"name": "transcode_video", "params": {"hls": True}}),
        (
            'ocr:languages=["eng","deu"],dpi=300',
            {"name": "ocr", "params": {"languages": ["eng", "deu"], "dpi": 300}},
        ),
        ("pdf_preview:pages=1-3,5", {"name": "pdf_preview", "params": {"pages": "1-3", "5": None}}),
        ("preset:avatar", {"preset": "avatar"}),
        ('{"name": "resize", "params": {"width": 800}}', {"name": "resize", "params": {"width": 800}}),
    ],
)
def test_an_op_becomes_the_requests_operation(spec: str, operation: object) -> None:
    if spec.startswith("pdf_preview"):  # a bare "5" is not key=value: refused, not guessed
        with pytest.raises(ValueError, match="key=value"):
            parse_op(spec)
        assert parse_op('pdf_preview:pages="1-3,5"') == {"name": "pdf_preview", "params": {"pages": "1-3,5"}}
        return
    assert parse_op(spec) == operation


@pytest.mark.parametrize("spec", [":size=1", "resize:width", "resize:=3"])
def test_a_malformed_op_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_op(spec)
