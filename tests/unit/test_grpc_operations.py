"""gRPC's typed operation params become REST's JSON params (``services.gateway.grpc_api``), here
the waveform's ``no_image``, which stands for REST's ``"image": false``; then checked by the
engine's own params validation as a REST request's are."""

from __future__ import annotations

import pytest

from hypermedia.api.jobs.v1 import jobs_pb2
from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.media.params import validate_params
from services.gateway.grpc_api import _operation


def test_a_waveform_without_its_image_is_the_rest_requests_image_false() -> None:
    typed = jobs_pb2.Operation(waveform=jobs_pb2.WaveformParams(buckets=100, no_image=True))
    assert _operation(typed) == {"name": "waveform", "params": {"buckets": 100, "image": False}}
    assert validate_params("waveform", _operation(typed)["params"])["image"] is False
    drawn = jobs_pb2.Operation(waveform=jobs_pb2.WaveformParams(image=jobs_pb2.WaveformImage(width=800)))
    assert _operation(drawn) == {"name": "waveform", "params": {"image": {"width": 800}}}
    assert validate_params("waveform", _operation(drawn)["params"])["image"]["width"] == 800


def test_image_and_no_image_together_are_refused() -> None:
    both = jobs_pb2.Operation(
        waveform=jobs_pb2.WaveformParams(image=jobs_pb2.WaveformImage(width=800), no_image=True)
    )
    with pytest.raises(InvalidArgument) as refused:
        _operation(both)
    assert refused.value.error_code == "INVALID_PARAMS"
