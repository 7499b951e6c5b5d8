"""The document and media part of the attack corpus: hostile PDFs, an OOXML document with an
external link, HLS and concat playlists, PostScript.

What these tests prove: the gateway types each file from its content without parsing it, stores
it like any upload, refuses *image* operations on it with ``415 UNSUPPORTED_FORMAT`` before any job
exists, and nothing reaches out to the listener. PDFs are processed by the docworker; the same
hostile PDFs go through pdfium in ``tests/security/test_pdf_corpus.py``; office documents go
through the docworker's checks (``tests/security/test_office_listener.py``). The playlists are
typed as text, so the media operations refuse them at creation too (checked here with ``probe``);
the mediaworker's own refusal of a playlist that reached it is proven in
``tests/unit/test_media_probe.py`` (segments never opened).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job
from tests.helpers.office import docx_with_external_image
from tests.helpers.pdf import pdf_deeply_nested, pdf_flate_bomb, pdf_with_pages
from tests.security.conftest import Listener

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"


def corpus(listener: Listener) -> list[tuple[str, bytes, str]]:
    """(file name, content, the type the gateway must give it)."""
    local = "/etc/passwd"
    return [
        ("fifty-thousand-pages.pdf", pdf_with_pages(50_000), "application/pdf"),
        ("flate-bomb.pdf", pdf_flate_bomb(), "application/pdf"),
        ("nested.pdf", pdf_deeply_nested(), "application/pdf"),
        ("pdf-named.jpg", pdf_with_pages(1), "application/pdf"),
        (
            "external-image.docx",
            docx_with_external_image(listener.url),
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        ),
        (
            "playlist.m3u8",
            f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://{listener.address}/seg0.ts\n"
            f"#EXTINF:10,\nfile://{local}\n#EXT-X-ENDLIST\n".encode(),
            "",
        ),
        (
            "concat.txt",
            f"ffconcat version 1.0\nfile '{local}'\nfile 'http://{listener.address}/a.mp4'\n".encode(),
            "",
        ),
        ("drawing.ps", b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 10 10\n(/etc/passwd) (r) file\nshowpage\n", ""),
        ("figure.eps", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", ""),
    ]


@pytest.fixture(scope="module")
def docs_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "docmedia", "credits,storage,gateway,imageworker"
    ) as running:
        yield running


def test_documents_and_media_are_stored_typed_and_refused_by_image_operations(
    docs_platform: RunningPlatform, listener: Listener
) -> None:
    account = docs_platform.admin("create-account", "--credits", "100")
    with docs_platform.client(account, timeout=60) as client:
        for name, content, expected_type in corpus(listener):
            response = client.post("/v1/objects", files={"file": (name, content)})
            assert response.status_code == 201, (name, response.text)
            obj: dict[str, Any] = response.json()
            if expected_type:
                assert obj["mime_type"] == expected_type, name
            assert not obj["mime_type"].startswith("image/"), (name, obj["mime_type"])
            refused = client.post(
                "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
            )
            assert refused.status_code == 415, (name, refused.text)
            assert refused.json()["error_code"] == "UNSUPPORTED_FORMAT"
            if name in ("playlist.m3u8", "concat.txt"):
                probed = client.post(
                    "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["probe"]}
                )
                assert probed.status_code == 415, (name, probed.text)
            with psycopg.connect(docs_platform.env["HM_DATABASE_URL"]) as conn:
                jobs = conn.execute(
                    "SELECT count(*) FROM processing_jobs WHERE object_id = %s", (obj["object_id"],)
                ).fetchone()
            assert jobs == (0,), name
        assert client.get("/v1/credits").json()["held"] == 0
        # The platform is unharmed: a normal job right after.
        photo = upload(client, PHOTO)
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        assert wait_job(client, job_id)["status"] == "completed"
    assert listener.connections == []


def test_the_generated_pdfs_are_what_they_claim() -> None:
    """The corpus files are real: the page count, the inflated size and the nesting depth."""
    many = pdf_with_pages(50_000)
    assert many.count(b"/Type /Page ") == 50_000 and b"/Count 50000" in many
    bomb = pdf_flate_bomb(64 << 20)
    start = bomb.index(b"stream\n") + len(b"stream\n")
    stream = bomb[start : bomb.rindex(b"\nendstream")]
    inflater = zlib.decompressobj()
    assert len(inflater.decompress(stream)) == 64 << 20 and inflater.eof  # checksum verified
    assert len(stream) < (64 << 20) // 500
    assert b"[" * 1000 + b"]" * 1000 in pdf_deeply_nested(1000)
