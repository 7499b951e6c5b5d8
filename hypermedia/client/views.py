"""What the client commands show: jobs and outputs as tables, and the names outputs are
downloaded as."""

from __future__ import annotations

import mimetypes
from typing import Any, Final

from rich.table import Table

from hypermedia.client.session import TERMINAL

EXTENSIONS: Final = {
    "image/webp": ".webp",
    "image/avif": ".avif",
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "application/pdf": ".pdf",
    "application/json": ".json",
    "text/plain": ".txt",
    "text/vtt": ".vtt",
    "application/vnd.apple.mpegurl": ".m3u8",
    "video/mp4": ".mp4",
    "audio/mp4": ".m4a",
    "audio/mpeg": ".mp3",
    "audio/ogg": ".ogg",
    "text/csv": ".csv",
}
"""File extensions of the outputs' types (``mimetypes`` knows only what the host's tables say)."""


def credits_shown(job: dict[str, Any]) -> str:
    """What a job costs, as far as it is known: what it was charged once it ended (0 when its
    hold was released), or what it holds until then."""
    if job.get("actual_credits") is not None:
        return str(job["actual_credits"])
    if job["status"] in TERMINAL:
        return "0"
    return f"{job.get('estimated_credits')} held"


def status_shown(job: dict[str, Any]) -> str:
    """A job's status, and for a delayed job still waiting when it will be queued."""
    if job["status"] == "scheduled" and job.get("not_before"):
        return f"scheduled for {job['not_before']}"
    return str(job["status"])


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("job_id", "operation", "status", "error", "credits", "created_at")
    for j in jobs:
        error = f"{j['error_code']}: {j['error_message']}" if j.get("error_code") else ""
        table.add_row(j["job_id"], j["operation"], status_shown(j), error, credits_shown(j), j["created_at"])
    return table


def outputs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("job_id", "output", "type", "bytes", "link")
    for j in jobs:
        for o in j.get("outputs", []):
            table.add_row(j["job_id"], o["output_type"], o["mime_type"], str(o["size_bytes"]), o["link"])
    return table


def saved_name(stem: str, output_type: str, mime_type: str) -> str:
    """The file name an output is downloaded as: ``{stem}.{output_type}{ext}``, the extension
    from the MIME type (``.bin`` when none is known), and the output type left out where it is
    the extension itself (``report.pdf``, not ``report.pdf.pdf``).

    >>> saved_name("report", "pdf", "application/pdf")
    'report.pdf'
    >>> saved_name("cat", "thumbnail", "image/webp; charset=binary")
    'cat.thumbnail.webp'
    """
    mime = mime_type.split(";")[0].strip()
    ext = EXTENSIONS.get(mime) or mimetypes.guess_extension(mime) or ".bin"
    return f"{stem}{ext}" if output_type == ext[1:] else f"{stem}.{output_type}{ext}"
