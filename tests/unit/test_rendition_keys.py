"""The last segment of an output's key (:func:`hypermedia.worker.transfer.rendition_name`): one
key per rendition when the engine's bytes are reproducible, one per job and attempt when they are
not (ADR 0050), and which handler says which."""

from __future__ import annotations

import dataclasses
import re

from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker.transfer import rendition_name
from services.docworker.__main__ import DocumentHandler
from services.imageworker.__main__ import ImageHandler
from tests.helpers.jobs import claimed_job


def _job(
    operation: str, params: dict[str, object], job_id: str = "0b7d7c5e-4f32-4b8e-9d53-0d1f0e3c2a11"
) -> ClaimedJob:
    return claimed_job(operation, "documents", job_id=job_id, params=params, backoff_base_seconds=10)


def test_a_reproducible_rendition_has_one_key_whatever_job_or_attempt_writes_it() -> None:
    first = _job("thumbnail", {"width": 256, "format": "webp"})
    other_job = dataclasses.replace(first, job_id="6a4f1d0e-2b3c-4d5e-8f90-a1b2c3d4e5f6")
    retry = dataclasses.replace(first, attempt=2)
    name = rendition_name(first, "thumbnail")
    assert re.fullmatch(r"thumbnail-[0-9a-f]{16}", name)
    assert rendition_name(other_job, "thumbnail") == rendition_name(retry, "thumbnail") == name
    assert rendition_name(_job("thumbnail", {"width": 128, "format": "webp"}), "thumbnail") != name


def test_an_unreproducible_rendition_has_a_key_per_job_and_per_attempt() -> None:
    first = _job("office_to_pdf", {})
    other_job = dataclasses.replace(first, job_id="6a4f1d0e-2b3c-4d5e-8f90-a1b2c3d4e5f6")
    retry = dataclasses.replace(first, attempt=2)
    names = {rendition_name(job, "pdf", reproducible=False) for job in (first, other_job, retry)}
    assert len(names) == 3
    assert all(re.fullmatch(r"pdf-[0-9a-f]{16}", name) for name in names)
    assert rendition_name(first, "pdf", reproducible=False) == rendition_name(
        first, "pdf", reproducible=False
    )


def test_a_key_ends_with_its_files_extension_for_players_that_look_at_the_url() -> None:
    """FFmpeg's HLS demuxer refuses a segment URL without a media extension: the key carries the
    file's (lowercased); nothing else of the file name, and no extension that storage's 64
    characters or its character set would refuse."""
    job = _job("transcode_video", {"heights": [360]})
    name = rendition_name(job, "hls_360p_media")
    assert rendition_name(job, "hls_360p_media", filename="hls_360p_media.mp4") == f"{name}.mp4"
    assert rendition_name(job, "hls_360p", filename="hls_360p.M3U8").endswith("-" + name[-16:] + ".m3u8")
    assert rendition_name(job, "hls_360p_media", filename="../x/evil name.mp4") == f"{name}.mp4"
    for odd in ("noextension", "a.tar.gz/", "x.mp4 ", "x.ünï", "x.toolong", "x."):
        assert rendition_name(job, "hls_360p_media", filename=odd) == name, odd
    long_type = "t" * 43
    assert rendition_name(job, long_type, filename="x.webp") == rendition_name(job, long_type)  # 60 + 5
    longest = rendition_name(job, "t" * 42, filename="x.webp")
    assert longest.endswith(".webp") and re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", longest)


def test_only_libreoffices_pdfs_are_unreproducible() -> None:
    documents = DocumentHandler.__new__(DocumentHandler)  # the hook reads nothing of the pool
    assert documents.reproducible(_job("office_to_pdf", {})) is False
    assert documents.reproducible(_job("text_extract", {})) is True
    assert documents.reproducible(_job("pdf_preview", {"pages": "1"})) is True
    assert ImageHandler().reproducible(_job("thumbnail", {"width": 256})) is True
