"""What the worker takes of an entry's request to fan out (:func:`hypermedia.worker.fanout.requested`,
ADR 0081): the sandboxed child ran on a hostile file, so the request is checked before a single
child job is made from it."""

from __future__ import annotations

from typing import Any

import pytest

from hypermedia.core.errors import TransientError
from hypermedia.engines.media import chunk_parts
from hypermedia.sandbox import OutputFile, SandboxResult
from hypermedia.worker import fanout


def _result(*outputs: OutputFile) -> SandboxResult:
    return SandboxResult(list(outputs), None, None, False, 10, 1)


def _ask(chunks: Any) -> OutputFile:
    return OutputFile("fan_out", "fanout.json", "application/json", {"chunks": chunks})


def test_a_run_with_outputs_asks_nothing() -> None:
    video = OutputFile("video_720p", "video_720p.mp4", "video/mp4", {"chunks": 5})
    assert fanout.requested(_result(video)) is None
    assert fanout.requested(_result()) is None


def test_a_request_gives_the_plans_chunk_count() -> None:
    assert fanout.requested(_result(_ask(3))) == 3
    assert fanout.requested(_result(_ask(60))) == 60


@pytest.mark.parametrize("chunks", [2, 61, 0, -4, True, 3.0, "5", None, [3]])
def test_a_count_out_of_bounds_or_of_another_type_is_refused(chunks: Any) -> None:
    with pytest.raises(TransientError) as refused:
        fanout.requested(_result(_ask(chunks)))
    assert refused.value.error_code == "INTERNAL"


def test_a_request_beside_other_outputs_is_refused() -> None:
    video = OutputFile("video_720p", "video_720p.mp4", "video/mp4", {})
    with pytest.raises(TransientError):
        fanout.requested(_result(_ask(4), video))
    with pytest.raises(TransientError):
        fanout.requested(_result(_ask(4), _ask(4)))


def test_the_workers_bounds_are_the_engines() -> None:
    assert (fanout.MIN_CHUNKS, fanout.MAX_CHUNKS) == (chunk_parts.MIN_FAN_OUT, chunk_parts.MAX_CHUNKS)
