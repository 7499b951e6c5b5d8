"""OCR end to end through REST on the real platform (`hypermedia up` with the ocrworker): the
corpus pages of ``tests/data/ocr/`` uploaded, OCRed by tesseract in the sandbox, and the outputs
downloaded and checked — text against the ground truth (character error rate), the searchable
PDF's text layer read back with PDFium, a table the test renders, escalation and its charge line
in the credit ledger, and the bad input of issue 6."""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pypdfium2 as pdfium
import pytest
import pyvips

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.engines.ocr import preprocess
from hypermedia.engines.ocr.metrics import cer
from hypermedia.engines.ocr.params import MAX_FANNED_OCR_PAGES
from hypermedia.jobs import charges
from tests.e2e.conftest import REPO, RunningPlatform, isolated_platform, upload, wait_for, wait_job
from tests.helpers.ocr import (
    EUROTEXT_LANGUAGES,
    GOLD,
    OCR_DIR,
    PARAGRAPH,
    PHOTOTEST,
    save_png,
    system_models,
    typeset,
)
from tests.helpers.tables import (
    AMOUNTS,
    INVOICE_ALIGN,
    expected_invoice_cells,
    render_invoice,
    render_table_page,
)

pytestmark = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract is not installed (make test installs it as root: scripts/ensure_debian_packages.sh)",
)

OCR_TIMEOUT = 180.0
"""Seconds a test waits for one OCR job: a page takes 2–10 s here, escalation adds RapidOCR's
model load; the platform may still be starting its ocrworker."""


def _ocr(client: httpx.Client, object_id: str, **params: Any) -> dict[str, Any]:
    created = client.post(
        "/v1/hypermedia/process",
        json={"object_id": object_id, "operations": [{"name": "ocr", "params": params}]},
    )
    assert created.status_code == 202, created.text
    return wait_job(client, created.json()["job_ids"][0], timeout=OCR_TIMEOUT)


def _outputs(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    return {o["output_type"]: o for o in job["outputs"]}


def _download(output: dict[str, Any]) -> bytes:
    response = httpx.get(output["url"], timeout=30)
    assert response.status_code == 200
    assert len(response.content) == output["size_bytes"]
    return response.content


def _upload_bytes(client: httpx.Client, name: str, content: bytes) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (name, content)})
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_phototest_text_words_hocr_and_searchable_pdf(client: httpx.Client) -> None:
    """The quality bar: ``phototest.tif`` within 2 % CER of its gold text; words with boxes and
    confidences; hOCR; a searchable PDF whose text layer holds the gold text."""
    obj = upload(client, PHOTOTEST)
    assert obj["mime_type"] == "image/tiff"
    job = _ocr(client, obj["object_id"], outputs=["text", "words", "hocr", "searchable_pdf"])
    outputs = _outputs(job)
    assert set(outputs) == {"text", "words", "hocr", "searchable_pdf"}
    text = _download(outputs["text"]).decode("utf-8")
    assert cer(text, GOLD) < 0.02, text
    meta = outputs["text"]["metadata"]
    assert meta["page_count"] == 1 and meta["pages"] == [1] and meta["languages"] == ["eng"]
    assert meta["word_count"] > 50 and meta["mean_confidence"] > 85
    # Charged by the page (ADR 0068): base 1.5 and 0.2 a page (migrations 0010, 0028), cut to the
    # price held for this small TIFF, so the page line is what the price has above base.
    assert meta["escalated_pages"] == 0
    assert job["charge_lines"] == {"pages": round(job["estimated_credits"] - 1.5, 3)}
    assert job["actual_credits"] == job["estimated_credits"] < 1.7

    words = json.loads(_download(outputs["words"]))
    [page] = words["pages"]
    assert words["engine"]["name"] == "tesseract" and page["engine"] == "tesseract"
    first = page["words"][0]
    assert first["text"] == "This" and len(first["bbox"]) == 4 and 0 < first["conf"] <= 100
    assert {"block", "par", "line", "word"} <= set(first)
    assert {step["step"] for step in page["preprocessing"]} >= {"orientation", "deskew", "upscale"}

    hocr = _download(outputs["hocr"]).decode("utf-8")
    hocr_words = re.findall(r"class='ocrx_word'[^>]*>([^<]*)<", hocr)
    assert cer(" ".join(hocr_words), GOLD) < 0.02

    pdf = pdfium.PdfDocument(_download(outputs["searchable_pdf"]))
    try:
        assert len(pdf) == 1
        textpage = pdf[0].get_textpage()
        layer = textpage.get_text_range()
    finally:
        pdf.close()
    assert cer(layer, GOLD) < 0.02, layer


def test_rotated_page_gives_the_same_text(client: httpx.Client) -> None:
    obj = upload(client, OCR_DIR / "phototest-rotated-R.png")
    outputs = _outputs(_ocr(client, obj["object_id"]))
    assert cer(_download(outputs["text"]).decode("utf-8"), GOLD) < 0.02
    steps = {s["step"]: s for s in json.loads(_download(outputs["words"]))["pages"][0]["preprocessing"]}
    assert steps["orientation"]["applied"] and steps["orientation"]["rotate"] in (90, 270)


def test_a_page_upside_down_reads_as_the_same_page_upright(client: httpx.Client, tmp_path: Path) -> None:
    """A 26-word paragraph typeset at 12 pt, 300 dpi, uploaded upright and upside down: the same
    text (tesseract's orientation confidence there, 6.63, is under its own margin of 7)."""
    upright = typeset(12, 300)
    texts, steps = {}, {}
    for name, image in (("upright", upright), ("turned", upright.rot("d180"))):
        obj = upload(client, save_png(image, tmp_path / f"{name}.png", dpi=300))
        outputs = _outputs(_ocr(client, obj["object_id"], escalate=False))
        texts[name] = _download(outputs["text"]).decode("utf-8")
        page = json.loads(_download(outputs["words"]))["pages"][0]
        steps[name] = {s["step"]: s for s in page["preprocessing"]}
    assert cer(texts["upright"], PARAGRAPH) < 0.02, texts["upright"]
    assert texts["turned"] == texts["upright"]
    assert not steps["upright"]["orientation"]["applied"]
    assert steps["turned"]["orientation"]["applied"] and steps["turned"]["orientation"]["rotate"] == 180


def test_eurotext_keeps_its_accents_with_its_languages(client: httpx.Client) -> None:
    obj = upload(client, OCR_DIR / "eurotext.tif")
    outputs = _outputs(_ocr(client, obj["object_id"], languages=EUROTEXT_LANGUAGES, outputs=["text"]))
    text = _download(outputs["text"]).decode("utf-8")
    for word in ("über", "«rapide»", "marrón", "rápido", "preguiçoso"):
        assert word in text, word
    assert cer(text, (OCR_DIR / "eurotext.txt").read_text(encoding="utf-8")) < 0.02


def test_a_rendered_table_comes_back_as_four_columns(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, render_table_page(tmp_path / "table.png"))
    outputs = _outputs(_ocr(client, obj["object_id"], table_detection=True, escalate=False))
    assert {"text", "words", "tables", "table_p1_1"} <= set(outputs)
    [page] = json.loads(_download(outputs["tables"]))["pages"]
    [table] = page["tables"]
    assert (table["n_rows"], table["n_cols"]) == (6, 4)
    assert outputs["table_p1_1"]["mime_type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(_download(outputs["table_p1_1"]).decode("utf-8"), newline="")))
    assert [len(row) for row in rows] == [4] * 6
    assert [row[3] for row in rows] == AMOUNTS


def test_an_invoice_with_narrow_gutters_comes_back_cell_for_cell(
    client: httpx.Client, tmp_path: Path
) -> None:
    """An invoice page (a right-aligned price column two digits from the unit column, a delivery
    row spanning two columns, text above and below): its one table, every cell, alignment and
    span, in ``tables.json`` and its CSV; the paragraphs stay text."""
    obj = upload(client, render_invoice(tmp_path / "invoice.png"))
    outputs = _outputs(_ocr(client, obj["object_id"], outputs=["text", "tables"], escalate=False))
    [page] = json.loads(_download(outputs["tables"]))["pages"]
    [table] = page["tables"]
    assert [[cell["text"] for cell in row] for row in table["rows"]] == expected_invoice_cells()
    assert table["align"] == list(INVOICE_ALIGN)
    assert [cell["span"] for cell in table["rows"][6]] == [2, 0, 1, 1, 1]
    rows = list(csv.reader(io.StringIO(_download(outputs["table_p1_1"]).decode("utf-8"), newline="")))
    assert rows == expected_invoice_cells()
    text_blocks = [b for b in page["blocks"] if b["kind"] == "text"]
    table_top, table_bottom = table["bbox"][1], table["bbox"][1] + table["bbox"][3]
    assert any(b["bbox"][1] + b["bbox"][3] <= table_top for b in text_blocks)
    assert any(b["bbox"][1] >= table_bottom for b in text_blocks)


def test_every_page_of_a_multi_page_tiff(client: httpx.Client, tmp_path: Path) -> None:
    """A two-page TIFF: both pages OCRed, their texts separated by a form feed; ``pages`` picks one."""
    page = pyvips.Image.new_from_file(str(PHOTOTEST))
    two = pyvips.Image.arrayjoin([page, page], across=1).copy()
    two.set_type(pyvips.GValue.gint_type, "page-height", page.height)
    path = tmp_path / "two.tif"
    two.tiffsave(str(path), compression="deflate")
    obj = upload(client, path)
    outputs = _outputs(_ocr(client, obj["object_id"], outputs=["text"]))
    assert outputs["text"]["metadata"]["page_count"] == 2 and outputs["text"]["metadata"]["pages"] == [1, 2]
    first, second = _download(outputs["text"]).decode("utf-8").split("\f")
    assert cer(first, GOLD) < 0.02 and cer(second, GOLD) < 0.02
    outputs = _outputs(_ocr(client, obj["object_id"], outputs=["text"], pages=[2]))
    assert outputs["text"]["metadata"]["pages"] == [2]


def test_an_empty_page_is_empty_text_not_an_error(client: httpx.Client) -> None:
    blank = (pyvips.Image.black(1200, 1600) + 255).cast("uchar").pngsave_buffer()
    outputs = _outputs(_ocr(client, _upload_bytes(client, "blank.png", blank)["object_id"]))
    assert _download(outputs["text"]).strip() == b""
    assert outputs["text"]["metadata"]["word_count"] == 0


def test_a_blurred_page_is_escalated_and_charged_as_its_own_line(
    platform: RunningPlatform, account: dict[str, Any], client: httpx.Client, tmp_path: Path
) -> None:
    """``phototest.tif`` blurred (tesseract reads almost nothing): RapidOCR reads it, the job
    records both confidences, and the escalated page is charged as an ``ocr_escalation`` line —
    its own ledger row beside the base price, within the hold."""
    blurred = tmp_path / "blurred.png"
    preprocess.to_grey(pyvips.Image.new_from_file(str(PHOTOTEST))).gaussblur(2.5).pngsave(str(blurred))
    obj = upload(client, blurred)
    before = client.get("/v1/credits").json()
    job = _ocr(client, obj["object_id"])
    outputs = _outputs(job)
    text = _download(outputs["text"]).decode("utf-8")
    assert cer(text, GOLD) < 0.10, text
    [page] = json.loads(_download(outputs["words"]))["pages"]
    assert page["escalated"] and page["engine"] == "rapidocr"
    assert set(page["confidences"]) == {"tesseract", "rapidocr"}
    assert outputs["text"]["metadata"]["escalated_pages"] == 1

    with psycopg.connect(platform.env["HM_DATABASE_URL"]) as conn:
        per_page, base_cost, per_unit = conn.execute(
            "SELECT escalation_per_page, base_cost, per_unit FROM processing_profiles WHERE operation = 'ocr' AND active"
        ).fetchone()
        ledger = dict(
            conn.execute(
                "SELECT line, amount FROM credit_ledger WHERE job_id = %s AND kind = 'commit'",
                (job["job_id"],),
            ).fetchall()
        )
    assert per_page > 0
    # The page read (within the price held) and its escalation (within its allowance): ADR 0068.
    price = round(job["estimated_credits"] * 1000)
    page = min(per_unit, price - base_cost)
    assert job["charge_lines"] == {"pages": page / 1000, "ocr_escalation": per_page / 1000}
    assert ledger == {"base": -base_cost, "pages": -page, "ocr_escalation": -per_page}
    assert job["actual_credits"] == (base_cost + page + per_page) / 1000
    after = client.get("/v1/credits").json()
    assert round((before["balance"] - after["balance"]) * 1000) == base_cost + page + per_page
    assert after["held"] == before["held"]


def test_an_ocr_page_over_the_jobs_cpu_time_is_charged_every_attempts_run(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    """The 8071 scan (about 3.7 s of tesseract CPU) against the OCR profile's timeout lowered to
    2 s: tesseract, a process of its own, gets what is left of the job's 2 s of CPU rather than
    its page's 60 s (ADR 0084) and uses it up. Each attempt ends ``TIMEOUT`` by CPU time, not
    as a plain retryable error, so the job, out of attempts, is charged as one failed because of
    its input: ``base`` + ``run_seconds`` over every attempt, committed from its hold."""
    obj = upload(client, OCR_DIR / "8071_093.3B.tif")
    before = client.get("/v1/credits").json()
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        [(timeout, backoff)] = conn.execute(
            "SELECT timeout_seconds, backoff_base_seconds FROM processing_profiles WHERE operation = 'ocr' AND active"
        ).fetchall()
        conn.execute(
            "UPDATE processing_profiles SET timeout_seconds = 2, backoff_base_seconds = 1 "
            "WHERE operation = 'ocr' AND active"
        )
        try:
            job = _ocr(client, obj["object_id"], outputs=["text"], escalate=False)
        finally:
            conn.execute(
                "UPDATE processing_profiles SET timeout_seconds = %s, backoff_base_seconds = %s "
                "WHERE operation = 'ocr' AND active",
                (timeout, backoff),
            )
        assert (job["status"], job["error_code"]) == ("failed", "TIMEOUT"), job
        assert job["error_message"] == "The job exceeded its CPU time limit.", job
        attempts = conn.execute(
            "SELECT status, error_code, duration_ms FROM job_attempts WHERE job_id = %s ORDER BY attempt_number",
            (job["job_id"],),
        ).fetchall()
        row = conn.execute(
            """SELECT j.estimated_credits, p.base_cost FROM processing_jobs j JOIN processing_profiles p
                 ON (p.operation, p.version) = (j.operation, j.profile_version) WHERE j.job_id = %s""",
            (job["job_id"],),
        ).fetchone()
    assert row is not None
    price, base = row
    assert len(attempts) == job["max_attempts"] and {a[:2] for a in attempts} == {("failed", "TIMEOUT")}, (
        attempts
    )
    charged = charges.for_failure(price=price, base_cost=base, run_ms=sum(a[2] for a in attempts))
    assert charged.lines.get("run_seconds", 0) > 0, charged
    assert round(charged.actual / 1000, 3) == job["actual_credits"], (charged, job)
    wait_for(
        "the charge committed",
        lambda: (
            round((before["balance"] - client.get("/v1/credits").json()["balance"]) * 1000) == charged.actual
        ),
        30,
    )


def test_languages_are_listed_and_an_uninstalled_one_is_422(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any]
) -> None:
    languages = client.get("/v1/ocr/languages").json()["languages"]
    assert {"eng", "deu", "fra", "spa"} <= set(languages) and "osd" not in languages
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        listed = jobs_pb2_grpc.JobServiceStub(channel).ListOcrLanguages(
            jobs_pb2.ListOcrLanguagesRequest(), metadata=[("authorization", f"Bearer {account['api_key']}")]
        )
    assert list(listed.languages) == languages

    obj = upload(client, PHOTOTEST)
    balance = client.get("/v1/credits").json()
    response = client.post(
        "/v1/hypermedia/process",
        json={
            "object_id": obj["object_id"],
            "operations": [{"name": "ocr", "params": {"languages": ["kor"]}}],
        },
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error_code"] == "INVALID_PARAMS"
    assert "kor" in body["detail"] and "eng" in body["detail"]
    assert client.get("/v1/credits").json() == balance  # nothing held, nothing queued


def test_bad_ocr_requests_are_specific_4xx(client: httpx.Client) -> None:
    svg = _upload_bytes(
        client,
        "text.svg",
        b'<svg xmlns="http://www.w3.org/2000/svg" width="200" height="50"><text x="5" y="30">Hi</text></svg>',
    )
    response = client.post(
        "/v1/hypermedia/process", json={"object_id": svg["object_id"], "operations": [{"name": "ocr"}]}
    )
    assert response.status_code == 415 and response.json()["error_code"] == "UNSUPPORTED_FORMAT"
    obj = upload(client, PHOTOTEST)
    for params in ({"outputs": ["pdf"]}, {"pages": "0"}, {"escalate": "yes"}, {"languages": ["../eng"]}):
        response = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": [{"name": "ocr", "params": params}]},
        )
        assert response.status_code == 422, (params, response.text)
        assert response.json()["error_code"] == "INVALID_PARAMS"


def test_a_256_megapixel_image_is_refused_before_tesseract(client: httpx.Client) -> None:
    """16384 × 16384 pixels (a real PNG of 268 M pixels, tiny compressed): the job fails on the
    pixel limit from the header, permanently, and costs nothing."""
    huge = (pyvips.Image.black(16384, 16384) + 255).cast("uchar").pngsave_buffer(compression=9)
    response = client.post("/v1/objects", files={"file": ("huge.png", huge)})
    if response.status_code != 201:  # refused at upload already: a specific error all the same
        assert response.status_code in (413, 422), response.text
        assert response.json()["error_code"].startswith("INPUT_TOO_LARGE")
        return
    balance = client.get("/v1/credits").json()
    job = _ocr(client, response.json()["object_id"])
    assert job["status"] == "failed" and job["error_code"] == "INPUT_TOO_LARGE_PIXELS"
    assert job["attempt_count"] == 1
    assert "16384" in job["error_message"] or "pixel" in job["error_message"]
    assert client.get("/v1/credits").json()["balance"] == balance["balance"]


def test_a_501_page_pdf_fails_with_a_clear_page_limit(client: httpx.Client) -> None:
    """501 pages, each an image: OCR of every page is refused (the page cap of a job that fans
    out, ADR 0082) before a page is rendered; asking for two of them works."""
    pdf = pdfium.PdfDocument.new()
    page_image = pdfium.PdfImage.new(pdf)
    bitmap = pdfium.PdfBitmap.from_pil(_pil_page())
    page_image.set_bitmap(bitmap)
    first = pdf.new_page(595, 842)
    page_image.set_matrix(pdfium.PdfMatrix().scale(595, 842))
    first.insert_obj(page_image)
    first.gen_content()
    for _ in range(MAX_FANNED_OCR_PAGES):
        pdf.import_pages(pdf, [0])
    buffer = io.BytesIO()
    pdf.save(buffer)
    pdf.close()
    obj = _upload_bytes(client, "scans.pdf", buffer.getvalue())
    job = _ocr(client, obj["object_id"])
    assert job["status"] == "failed" and job["error_code"] == "OCR_PAGE_LIMIT", job["error_message"]
    assert f"501 pages; one job OCRs at most {MAX_FANNED_OCR_PAGES}" in job["error_message"]
    assert job["attempt_count"] == 1
    outputs = _outputs(
        _ocr(client, obj["object_id"], pages="1,501", outputs=["text"], escalate=False, skip_text_pages=True)
    )
    assert outputs["text"]["metadata"]["page_count"] == 501
    assert outputs["text"]["metadata"]["pages"] == [1, 501]


def _pil_page() -> Any:
    from PIL import Image

    return Image.open(PHOTOTEST).convert("L")


def test_the_ocrworker_reports_its_status(platform: RunningPlatform) -> None:
    from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc

    with platform.internal_channel(platform.info["workers"]["ocrworker"]) as channel:
        status = worker_pb2_grpc.WorkerServiceStub(channel).GetStatus(
            worker_pb2.GetStatusRequest(), timeout=10
        )
    assert status.queue == "ocr" and status.slots_total == 2


def test_a_models_directory_from_tessdata_prefix_serves_the_jobs_too(
    tmp_root: Path, database_url: str, nats_url: str
) -> None:
    """An ocrworker started with ``TESSDATA_PREFIX`` reports that directory's models and its jobs
    read them: a model installed only there (``hmx``, English under another name) recognises text.
    The directory lies in the checkout, which a job's mount namespace keeps readable (``/tmp`` is
    an empty tmpfs there)."""
    system = system_models()
    models = REPO / ".hypermedia" / f"tessdata-{secrets.token_hex(4)}"
    models.mkdir(parents=True)
    try:
        (models / "hmx.traineddata").symlink_to(system / "eng.traineddata")
        for shared in ("osd.traineddata", "configs", "pdf.ttf"):  # what a models directory needs
            (models / shared).symlink_to(system / shared)
        with isolated_platform(
            tmp_root,
            database_url,
            nats_url,
            "tessdata",
            "credits,storage,gateway,ocrworker",
            TESSDATA_PREFIX=str(models),
        ) as running:
            with running.client(running.admin("create-account", "--credits", "100")) as client:
                wait_for(
                    "the ocrworker's language report",
                    lambda: client.get("/v1/ocr/languages").json()["languages"] == ["hmx"] or None,
                    60,
                    interval=0.5,
                )
                obj = upload(client, PHOTOTEST)
                job = _ocr(client, obj["object_id"], languages=["hmx"], outputs=["text", "searchable_pdf"])
                outputs = _outputs(job)
                assert outputs["text"]["metadata"]["languages"] == ["hmx"]
                assert cer(_download(outputs["text"]).decode("utf-8"), GOLD) < 0.02
                refused = client.post(
                    "/v1/hypermedia/process",
                    json={
                        "object_id": obj["object_id"],
                        "operations": [{"name": "ocr", "params": {"languages": ["eng"]}}],
                    },
                )
                assert refused.status_code == 422 and "hmx" in refused.json()["detail"], refused.text
    finally:
        shutil.rmtree(models)
