"""What the OCR tests share: the corpus pages and their ground truth, the limits the unit tests run the
engine with, a run of the engine read back (:func:`ocr`), and a paragraph typeset here for pages
turned as a whole (:func:`typeset`)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pyvips

from hypermedia.engines.contract import OutputFile
from hypermedia.engines.ocr import preprocess
from hypermedia.engines.ocr.engine import OcrLimits, run

OCR_DIR = Path(__file__).resolve().parents[1] / "data" / "ocr"
PHOTOTEST = OCR_DIR / "phototest.tif"
GOLD = (OCR_DIR / "phototest.gold.txt").read_text(encoding="utf-8")
LIMITS = OcrLimits(max_input_bytes=100 << 20, max_page_pixels=100_000_000)
EUROTEXT_LANGUAGES = ["spa", "por", "deu", "fra", "ita", "eng"]
"""The six languages of ``eurotext.tif``, Spanish first: with the Debian (tessdata_fast) models the
first language is the primary one, and with ``eng`` first tesseract keeps the English-looking
readings "marron rapido" of two Spanish words (measured)."""

needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract is not installed (scripts/ensure_debian_packages.sh tesseract-ocr tesseract-ocr-eng …)",
)


def system_models() -> Path:
    """The directory tesseract reads its models from here (the first line of ``--list-langs``:
    ``List of available languages in "/usr/share/tesseract-ocr/5/tessdata/" (7):``)."""
    listing = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True, check=True)
    return Path(listing.stdout.split('"')[1])


class Result:
    """The outputs of one :func:`run`, read back."""

    def __init__(self, outputs: list[OutputFile], out_dir: Path) -> None:
        self.outputs = {o.output_type: o for o in outputs}
        self.out_dir = out_dir

    def path(self, output_type: str) -> Path:
        return self.out_dir / self.outputs[output_type].filename

    @property
    def text(self) -> str:
        return self.path("text").read_text(encoding="utf-8")

    @property
    def words(self) -> Any:
        return json.loads(self.path("words").read_text(encoding="utf-8"))

    def steps(self, page: int = 1) -> dict[str, dict]:
        """The preprocessing records of a page, by step name."""
        return {s["step"]: s for s in self.words["pages"][page - 1]["preprocessing"]}


def ocr(
    source: Path, tmp_path: Path, limits: OcrLimits = LIMITS, *, preprocessing: bool = True, **job_params: Any
) -> Result:
    out_dir = tmp_path / f"out-{secrets.token_hex(4)}"
    out_dir.mkdir()
    outputs = run("ocr", job_params, source, out_dir, limits=limits, preprocessing=preprocessing)
    return Result(outputs, out_dir)


def grey_page(path: Path) -> pyvips.Image:
    return preprocess.to_grey(pyvips.Image.new_from_file(str(path))).copy_memory()


def save_png(image: pyvips.Image, path: Path, dpi: float | None = None) -> Path:
    if dpi is not None:
        image = image.copy(xres=dpi / 25.4, yres=dpi / 25.4)
    image.pngsave(str(path))
    return path


PARAGRAPH = (
    "A clean page scanned upside down or on its side must read like the same page scanned "
    "upright: every line with its words in their order."
)
"""The text typeset on every page (26 words, 135 characters)."""
FONT = "DejaVu Serif"
"""Found by fontconfig (Debian's ``fonts-dejavu-core``, which LibreOffice and Pango depend on)."""


def typeset(points: int, dpi: int) -> pyvips.Image:
    """The paragraph, black on white, in lines of 4 inches with half-inch margins; 8-bit grey
    (Pango's antialiased edges kept)."""
    ink = pyvips.Image.text(PARAGRAPH, font=f"{FONT} {points}", dpi=dpi, width=4 * dpi)
    margin = dpi // 2
    page = (255 - ink).embed(margin, margin, ink.width + 2 * margin, ink.height + 2 * margin, extend="white")
    return page.cast("uchar").copy(interpretation="b-w")
