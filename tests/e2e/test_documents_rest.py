"""PDF jobs end to end through REST on the real platform (`hypermedia up` with the docworker):
upload → process → poll → download, checked by decoding the outputs and comparing them with
PDFium renders and text made in the test."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pypdfium2 as pdfium
import pytest
import pyvips
from PIL import Image

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job
from tests.helpers import glyphs
from tests.helpers.pdf import (
    FILLED_NAME,
    LETTER,
    PDF_DIR,
    field_rect,
    filled_forms_pdf,
    ink,
    mean_abs_diff,
    pixel_box,
    reference_render,
    text_pages_pdf,
)

EXIF = PDF_DIR.parent / "exif-orientation"


def _process(client: httpx.Client, object_id: str, operation: str | dict[str, Any]) -> dict[str, Any]:
    created = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert created.status_code == 202, created.text
    return wait_job(client, created.json()["job_ids"][0])


def _download(output: dict[str, Any]) -> httpx.Response:
    response = httpx.get(output["url"], timeout=30)
    assert response.status_code == 200
    assert len(response.content) == output["size_bytes"]
    assert response.headers["content-type"] == output["mime_type"]
    return response


def _upload_bytes(client: httpx.Client, name: str, content: bytes) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (name, content)})
    assert response.status_code == 201, response.text
    return dict(response.json())


@pytest.mark.parametrize(
    ("name", "pages", "width", "height", "has_forms"),
    [
        ("minimal-document.pdf", 1, 595.28, 841.89, False),
        ("pdflatex-4-pages.pdf", 4, 595.28, 841.89, False),
        ("multicolumn.pdf", 3, 595.28, 841.89, False),
        ("pdflatex-forms.pdf", 1, 612.0, 792.0, True),
        ("google-doc-document.pdf", 1, 596.0, 842.0, False),
    ],
)
def test_pdf_info_of_each_corpus_file(
    client: httpx.Client, name: str, pages: int, width: float, height: float, has_forms: bool
) -> None:
    obj = upload(client, PDF_DIR / name)
    assert obj["mime_type"] == "application/pdf"
    job = _process(client, obj["object_id"], "pdf_info")
    assert job["status"] == "completed", job
    assert job["queue"] == "documents" and job["params"] == {}
    assert job["attempts"][0]["worker_id"].startswith("local/docworker/")
    assert job["actual_credits"] == job["estimated_credits"] > 0
    [output] = job["outputs"]
    assert (output["output_type"], output["mime_type"]) == ("info", "application/json")
    assert output["key"].startswith(f"derived/{obj['pool_id']}/{obj['object_id']}/1/info-")
    info = _download(output).json()
    assert info["page_count"] == pages
    assert info["pages"] == [{"page": n, "width": width, "height": height} for n in range(1, pages + 1)]
    assert (info["has_forms"], info["encrypted"], info["has_text_layer"]) == (has_forms, False, True)
    assert info["producer"]
    assert output["metadata"]["page_count"] == pages and "pages" not in output["metadata"]


def test_a_preview_of_page_n_is_page_n(client: httpx.Client) -> None:
    source = PDF_DIR / "pdflatex-4-pages.pdf"
    obj = upload(client, source)
    job = _process(
        client,
        obj["object_id"],
        {"name": "pdf_preview", "params": {"pages": "1-4", "format": "png", "dpi": 36}},
    )
    assert job["status"] == "completed", job
    assert job["params"] == {"pages": [1, 2, 3, 4], "format": "png", "dpi": 36}
    outputs = {o["output_type"]: o for o in job["outputs"]}
    assert sorted(outputs) == ["preview_p1", "preview_p2", "preview_p3", "preview_p4"]
    references = [reference_render(source, i, 0.5) for i in range(4)]
    for n in range(1, 5):
        output = outputs[f"preview_p{n}"]
        assert output["mime_type"] == "image/png"
        assert output["key"].rsplit("/", 1)[1].startswith(f"preview_p{n}-")
        assert output["metadata"]["page"] == n and output["metadata"]["page_count"] == 4
        image = pyvips.Image.new_from_buffer(_download(output).content, "")
        assert (
            (image.width, image.height)
            == (output["metadata"]["width"], output["metadata"]["height"])
            == (298, 421)
        )
        distances = [mean_abs_diff(image, reference) for reference in references]
        assert distances[n - 1] < 0.5, distances
        assert min(d for i, d in enumerate(distances) if i != n - 1) > 3, distances


def _noise_pdf(pages: int, side: int = 1200) -> bytes:
    """A PDF of ``pages`` pages of random noise (Pillow's PDF writer: one JPEG a page, about
    1 MiB each at this side): large for few pages."""
    rng = random.Random(23)
    images = [Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3)) for _ in range(pages)]
    out = io.BytesIO()
    images[0].save(out, "PDF", save_all=True, append_images=images[1:], resolution=150)
    return out.getvalue()


def test_a_preview_is_charged_the_pages_it_rendered_within_the_price_held(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    """ADR 0068: the hold is the price by size (1 + 0.2 a MiB, migration 0007), the charge the
    pages rendered (1 + 0.05 a page, migration 0028), never more than the hold. One page of a
    large PDF costs 1.05 credits; four pages of a 24 KiB PDF are cut to its price."""
    before = client.get("/v1/credits").json()
    large = _upload_bytes(client, "noise.pdf", _noise_pdf(3))
    assert large["size_bytes"] > 2 * 1024 * 1024
    one_page = _process(
        client, large["object_id"], {"name": "pdf_preview", "params": {"pages": "2", "dpi": 18}}
    )
    assert one_page["status"] == "completed", one_page
    assert one_page["estimated_credits"] == pytest.approx(1 + 0.2 * large["size_bytes"] / 2**20, abs=0.001)
    assert (one_page["actual_credits"], one_page["charge_lines"]) == (1.05, {"pages": 0.05})

    small = upload(client, PDF_DIR / "pdflatex-4-pages.pdf")
    four_pages = _process(
        client, small["object_id"], {"name": "pdf_preview", "params": {"pages": "1-4", "dpi": 18}}
    )
    assert four_pages["estimated_credits"] == 1.005  # 1 + 0.2 × 24,607 / 2^20, rounded up
    assert (four_pages["actual_credits"], four_pages["charge_lines"]) == (1.005, {"pages": 0.005})

    with psycopg.connect(platform.env["HM_DATABASE_URL"]) as conn:
        ledger = conn.execute(
            "SELECT job_id::text, line, amount FROM credit_ledger WHERE job_id = ANY(%s) AND kind = 'commit' "
            "ORDER BY job_id, line",
            ([one_page["job_id"], four_pages["job_id"]],),
        ).fetchall()
    assert sorted(ledger) == sorted(
        [
            (one_page["job_id"], "base", -1000),
            (one_page["job_id"], "pages", -50),
            (four_pages["job_id"], "base", -1000),
            (four_pages["job_id"], "pages", -5),
        ]
    )
    after = client.get("/v1/credits").json()
    assert round((before["balance"] - after["balance"]) * 1000) == 1050 + 1005
    assert after["held"] == before["held"]

    # GET /v1/account/ledger explains both charges line by line, newest first (a job's commit can
    # follow the next job's hold: the settlement comes just after the status the test waited for).
    page = client.get("/v1/account/ledger", params={"limit": 6}).json()
    by_job: dict[str, list[tuple[str, str, float, str, str]]] = {}
    for e in page["entries"]:
        by_job.setdefault(e["job_id"], []).append(
            (e["kind"], e["line"], e["credits"], e["operation"], e["job_status"])
        )
    assert by_job == {
        four_pages["job_id"]: [
            ("commit", "pages", -0.005, "pdf_preview", "completed"),
            ("commit", "base", -1.0, "pdf_preview", "completed"),
            ("hold", "base", 1.005, "pdf_preview", "completed"),
        ],
        one_page["job_id"]: [
            ("commit", "pages", -0.05, "pdf_preview", "completed"),
            ("commit", "base", -1.0, "pdf_preview", "completed"),
            ("hold", "base", one_page["estimated_credits"], "pdf_preview", "completed"),
        ],
    }
    assert [e["entry_id"] for e in page["entries"]] == sorted(
        (e["entry_id"] for e in page["entries"]), reverse=True
    )
    assert page["next_cursor"] and page["entries"][0]["at"] >= page["entries"][-1]["at"]
    older = client.get("/v1/account/ledger", params={"limit": 1, "cursor": page["next_cursor"]}).json()
    assert older["entries"][0]["entry_id"] < page["entries"][-1]["entry_id"]
    refused = client.get("/v1/account/ledger", params={"cursor": "yesterday"})
    assert (refused.status_code, refused.json()["error_code"]) == (422, "INVALID_CURSOR")
    # An empty cursor is the first page, as for jobs and objects.
    first = client.get("/v1/account/ledger", params={"limit": 6, "cursor": ""}).json()
    assert [e["entry_id"] for e in first["entries"]] == [e["entry_id"] for e in page["entries"]]


def test_default_preview_is_a_webp_of_page_1(client: httpx.Client) -> None:
    obj = upload(client, PDF_DIR / "google-doc-document.pdf")
    job = _process(client, obj["object_id"], "pdf_preview")
    assert job["status"] == "completed", job
    assert job["params"] == {"pages": [1], "format": "webp", "dpi": 96}
    [output] = job["outputs"]
    assert (output["output_type"], output["mime_type"]) == ("preview_p1", "image/webp")
    image = pyvips.Image.new_from_buffer(_download(output).content, "")
    assert (image.width, image.height) == (795, 1123)
    assert not {"exif-data", "xmp-data", "icc-profile-data"} & set(image.get_fields())
    assert mean_abs_diff(image, reference_render(PDF_DIR / "google-doc-document.pdf", 0, 96 / 72)) < 4


def test_form_field_values_are_visible_in_the_preview(client: httpx.Client) -> None:
    filled = filled_forms_pdf()
    obj = _upload_bytes(client, "filled-form.pdf", filled)
    job = _process(client, obj["object_id"], {"name": "pdf_preview", "params": {"format": "png", "dpi": 144}})
    assert job["status"] == "completed", job
    image = pyvips.Image.new_from_buffer(_download(job["outputs"][0]).content, "")
    name_box = pixel_box(field_rect(filled, 0), LETTER[1], 2.0)
    inner = (name_box[0] + 4, name_box[1] + 4, name_box[2] - 8, name_box[3] - 8)
    assert ink(image, inner) > 150, f"{FILLED_NAME!r} is drawn in the Name field"
    assert ink(reference_render(filled, 0, 2.0), inner) == 0, "without the form layer the field is empty"


def test_a_preview_draws_cjk_fonts_the_pdf_does_not_embed(client: httpx.Client) -> None:
    """The Adobe CJK fonts a PDF names without embedding them are drawn in the docworker's Noto
    CJK (PDFium substitutes an installed font with the character collection; without one it
    draws nothing); the text layer is the same either way (issue 15)."""
    data = glyphs.non_embedded_cjk_pdf()
    obj = _upload_bytes(client, "cjk-not-embedded.pdf", data)
    dpi = 144
    job = _process(client, obj["object_id"], {"name": "pdf_preview", "params": {"format": "png", "dpi": dpi}})
    assert job["status"] == "completed", job
    image = pyvips.Image.new_from_buffer(_download(job["outputs"][0]).content, "")
    page = pdfium.PdfDocument(data)[0]
    glyphs.check_glyphs(page, glyphs.grey(image), dpi / 72, list(glyphs.SCRIPTS)[:4])
    text = _process(client, obj["object_id"], "text_extract")
    assert text["status"] == "completed", text
    body = _download(next(o for o in text["outputs"] if o["output_type"] == "text")).content.decode()
    assert all(glyphs.SCRIPTS[script][0] in body for script in list(glyphs.SCRIPTS)[:4]), body


def test_text_extract_drops_the_control_characters_pdfium_passes_through(
    client: httpx.Client, tmp_path: Path
) -> None:
    """A page whose text shows U+0003, U+0001, DEL and a C1 control between letters: PDFium hands
    them on as they are; the ``text`` and ``text_json`` outputs keep the letters and the tab only
    (issue 15)."""
    path = tmp_path / "controls.pdf"
    path.write_bytes(text_pages_pdf(["A\x03B\x01C\x7fD\x85E\tF"]))
    job = _process(client, upload(client, path)["object_id"], "text_extract")
    assert job["status"] == "completed", job
    outputs = {o["output_type"]: o for o in job["outputs"]}
    assert _download(outputs["text"]).content.decode().strip() == "ABCDE\tF"
    assert _download(outputs["text_json"]).json()["pages"][0]["text"].strip() == "ABCDE\tF"


def test_text_extract_of_a_two_column_pdf(client: httpx.Client) -> None:
    obj = upload(client, PDF_DIR / "multicolumn.pdf")
    job = _process(client, obj["object_id"], "text_extract")
    assert job["status"] == "completed", job
    outputs = {o["output_type"]: o for o in job["outputs"]}
    assert sorted(outputs) == ["text", "text_json"]
    assert outputs["text"]["mime_type"] == "text/plain; charset=utf-8"
    assert outputs["text_json"]["mime_type"] == "application/json"
    plain = _download(outputs["text"]).content.decode()
    data = _download(outputs["text_json"]).json()
    assert data["page_count"] == 3 and data["has_text_layer"] is True
    assert [p["chars"] for p in data["pages"]] == [len(p["text"]) for p in data["pages"]]
    assert plain.split("\f") == [p["text"] for p in data["pages"]]
    assert outputs["text"]["metadata"] == {
        "page_count": 3,
        "has_text_layer": True,
        "chars": data["chars"],
        "size_bytes": outputs["text"]["size_bytes"],
    }
    page1 = data["pages"][0]["text"]
    # Column by column: the left column ends, then the right one starts at the top of the page.
    assert "Donec nonummy\npellentesque ante. Phasellus adipiscing semper elit." in page1
    assert page1.index("Nulla malesuada porttitor diam") < page1.index("Quisque ullamcorper placerat ipsum")


def test_password_protected_pdf_fails_with_password_required_and_costs_nothing(client: httpx.Client) -> None:
    before = client.get("/v1/credits").json()
    obj = upload(client, PDF_DIR / "libreoffice-writer-password.pdf")
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        job = _process(client, obj["object_id"], operation)
        assert (job["status"], job["error_code"]) == ("failed", "PASSWORD_REQUIRED"), job
        assert job["error_message"] == "The PDF is encrypted and needs a password to open."
        assert job["attempt_count"] == 1 and job["outputs"] == [] and job["actual_credits"] is None
    assert client.get("/v1/credits").json() == before
    # With a password: tests/e2e/test_pdf_passwords.py.


@pytest.mark.parametrize(
    ("operation", "status", "error_code"),
    [
        ({"name": "pdf_preview", "params": {"pages": "1-21"}}, 422, "INVALID_PARAMS"),
        ({"name": "pdf_preview", "params": {"width": 640, "dpi": 150}}, 422, "INVALID_PARAMS"),
        ({"name": "pdf_preview", "params": {"format": "gif"}}, 422, "INVALID_PARAMS"),
        ({"name": "text_extract", "params": {"pages": [1]}}, 422, "INVALID_PARAMS"),
        ("docx_to_pdf", 422, "UNKNOWN_OPERATION"),
        ("office_to_pdf", 415, "UNSUPPORTED_FORMAT"),
        ("thumbnail", 415, "UNSUPPORTED_FORMAT"),
    ],
)
def test_bad_document_requests_are_specific_4xx(
    client: httpx.Client, operation: Any, status: int, error_code: str
) -> None:
    obj = upload(client, PDF_DIR / "minimal-document.pdf")
    response = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
    )
    assert response.status_code == status, response.text
    assert response.json()["error_code"] == error_code


def test_document_operations_refuse_images(client: httpx.Client) -> None:
    obj = upload(client, EXIF / "Landscape_1.jpg")
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        response = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
        )
        assert response.status_code == 415, response.text
        assert response.json()["error_code"] == "UNSUPPORTED_FORMAT"


def test_page_past_the_end_fails_the_job_with_invalid_params(client: httpx.Client) -> None:
    obj = upload(client, PDF_DIR / "pdflatex-4-pages.pdf")
    job = _process(client, obj["object_id"], {"name": "pdf_preview", "params": {"pages": [2, 7]}})
    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", "INVALID_PARAMS", 1)
    assert job["error_message"] == "The PDF has 4 pages; page 7 does not exist."


def test_profiles_and_the_docworker(platform: RunningPlatform) -> None:
    with psycopg.connect(platform.env["HM_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT operation, queue, input_kinds, timeout_seconds, memory_limit_mb, max_pixels, active"
            " FROM processing_profiles WHERE queue = 'documents' ORDER BY operation, version"
        ).fetchall()
    assert [(r[0], r[1], r[2], r[6]) for r in rows] == [
        ("office_to_pdf", "documents", ["office"], True),
        ("pdf_info", "documents", ["pdf"], True),
        ("pdf_preview", "documents", ["pdf"], True),
        ("text_extract", "documents", ["pdf"], False),
        ("text_extract", "documents", ["pdf", "office"], True),
    ]
    assert {r[0]: r[5] for r in rows}["pdf_preview"] == 40_000_000
    with platform.internal_channel(platform.info["workers"]["docworker"]) as chan:
        status = worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(worker_pb2.GetStatusRequest())
    assert status.queue == "documents" and status.slots_total == 2
    assert status.worker_id.startswith("local/docworker/")
    log = (platform.state_dir / "logs" / "docworker.log").read_text()
    assert "docworker serving" in log
