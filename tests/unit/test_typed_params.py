"""gRPC's typed params (issue 22 item 3): ``Operation``'s ``typed`` oneof has a message per
operation whose fields are that operation's params (so ``grpcurl describe`` shows them), and a
typed operation becomes exactly the ``{name, params}`` REST would send, which the operation's
schema and validator accept."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from hypermedia.api.jobs.v1 import jobs_pb2
from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.documents import params as document_params
from hypermedia.engines.imaging import ops as image_ops
from hypermedia.engines.media import params as media_params
from hypermedia.engines.ocr import params as ocr_params
from hypermedia.engines.schemas import PARAMS_SCHEMAS
from services.gateway.grpc_api import _operation

TYPED = jobs_pb2.Operation.DESCRIPTOR.oneofs_by_name["typed"]
VALIDATORS = {
    **dict.fromkeys(image_ops.OPERATIONS, image_ops.validate_params),
    **dict.fromkeys(document_params.OPERATIONS, document_params.validate_params),
    **dict.fromkeys(media_params.OPERATIONS, media_params.validate_params),
    **dict.fromkeys(ocr_params.OPERATIONS, ocr_params.validate_params),
}


def test_every_operation_with_params_has_a_typed_message_of_its_params() -> None:
    assert {f.name for f in TYPED.fields} == set(PARAMS_SCHEMAS) - {"noop"}
    for field in TYPED.fields:
        # password: taken out before the checks; no_image: the waveform's "image": false
        names = {f.name for f in field.message_type.fields} - {"password", "no_image"}
        assert names == set(PARAMS_SCHEMAS[field.name].get("properties", {})), field.name


EXAMPLES: list[jobs_pb2.Operation] = [
    jobs_pb2.Operation(thumbnail=jobs_pb2.ThumbnailParams(size=128)),
    jobs_pb2.Operation(resize=jobs_pb2.ResizeParams(width=800, height=600, fit="cover", format="webp")),
    jobs_pb2.Operation(compress=jobs_pb2.CompressParams(quality=60)),
    jobs_pb2.Operation(convert=jobs_pb2.ConvertParams(format="avif", quality=50)),
    jobs_pb2.Operation(pdf_info=jobs_pb2.PdfInfoParams()),
    jobs_pb2.Operation(pdf_preview=jobs_pb2.PdfPreviewParams(pages="1-3,5", dpi=150, format="png")),
    jobs_pb2.Operation(text_extract=jobs_pb2.TextExtractParams()),
    jobs_pb2.Operation(office_to_pdf=jobs_pb2.OfficeToPdfParams()),
    jobs_pb2.Operation(
        ocr=jobs_pb2.OcrParams(
            languages=["eng", "deu"], pages="1-2", outputs=["text", "hocr"], escalate=False
        )
    ),
    jobs_pb2.Operation(probe=jobs_pb2.ProbeParams()),
    jobs_pb2.Operation(
        waveform=jobs_pb2.WaveformParams(
            buckets=400, channels="mix", image=jobs_pb2.WaveformImage(color="#112233")
        )
    ),
    jobs_pb2.Operation(poster=jobs_pb2.PosterParams(width=320, sprite=jobs_pb2.PosterSprite(count=20))),
    jobs_pb2.Operation(poster=jobs_pb2.PosterParams(sprite=jobs_pb2.PosterSprite())),
    jobs_pb2.Operation(
        transcode_video=jobs_pb2.TranscodeVideoParams(codec="h264", heights=[720, 360], hls=True)
    ),
    jobs_pb2.Operation(
        transcode_audio=jobs_pb2.TranscodeAudioParams(
            format="opus", loudness=jobs_pb2.TranscodeLoudness(target_lufs=-16)
        )
    ),
]


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: str(op.WhichOneof("typed")))
def test_a_typed_operation_is_the_params_rest_would_send(op: jobs_pb2.Operation) -> None:
    shape: dict[str, Any] = _operation(op)
    name, params = shape["name"], shape["params"]
    assert name == op.WhichOneof("typed")
    assert Draft202012Validator(PARAMS_SCHEMAS[name]).is_valid(params), params
    VALIDATORS[name](name, params)  # raises InvalidArgument if the platform would refuse them
    assert (
        params
        == {
            field.name: value if not hasattr(value, "ListFields") else params[field.name]
            for field, value in getattr(op, name).ListFields()
        }
        or params == {}
    )


def test_the_sets_that_turn_a_feature_on_read_as_the_validators_do() -> None:
    assert _operation(jobs_pb2.Operation(poster=jobs_pb2.PosterParams(sprite=jobs_pb2.PosterSprite())))[
        "params"
    ] == {"sprite": {}}
    assert (
        media_params.validate_params("poster", {"sprite": {}})["sprite"] is not None
    )  # on, with its defaults


def test_typed_with_a_name_or_params_beside_it_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="typed"):
        _operation(jobs_pb2.Operation(name="resize", thumbnail=jobs_pb2.ThumbnailParams(size=1)))


def test_a_waveform_without_its_image_is_the_rest_requests_image_false() -> None:
    typed = jobs_pb2.Operation(waveform=jobs_pb2.WaveformParams(buckets=100, no_image=True))
    assert _operation(typed) == {"name": "waveform", "params": {"buckets": 100, "image": False}}
    assert media_params.validate_params("waveform", _operation(typed)["params"])["image"] is False
    both = jobs_pb2.Operation(
        waveform=jobs_pb2.WaveformParams(image=jobs_pb2.WaveformImage(width=800), no_image=True)
    )
    with pytest.raises(InvalidArgument) as refused:
        _operation(both)
    assert refused.value.error_code == "INVALID_PARAMS"
