"""What an OCR engine returns for one page, and the protocol every engine implements.

Tesseract (:class:`hypermedia.engines.ocr.tesseract.Tesseract`) is the first engine; a second one for
escalation (RapidOCR with its ONNX models, issue 6) implements the same protocol, and the caller
keeps the better :class:`PageText` by :attr:`PageText.mean_confidence`. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["OcrEngine", "PageText", "Word"]


@dataclass(frozen=True)
class Word:
    """One recognised word."""

    text: str
    """The word as recognised (never empty, no white space)."""
    bbox: tuple[int, int, int, int]
    """``(x, y, width, height)`` in pixels of the page image the engine was given (after
    preprocessing), origin top left."""
    conf: float
    """Confidence 0–100 (tesseract's word confidence)."""
    block: int
    """Block number on the page (1-based)."""
    par: int
    """Paragraph number within its block (1-based)."""
    line: int
    """Line number within its paragraph (1-based)."""
    word: int
    """Word number within its line (1-based)."""

    def as_json(self) -> dict:
        """``{"text", "bbox": [x, y, w, h], "conf", "block", "par", "line", "word"}``."""
        return {
            "text": self.text,
            "bbox": list(self.bbox),
            "conf": self.conf,
            "block": self.block,
            "par": self.par,
            "line": self.line,
            "word": self.word,
        }


@dataclass(frozen=True)
class PageText:
    """An engine's result for one page image."""

    engine: str
    """Which engine produced it (``tesseract``)."""
    text: str
    """Plain text in reading order, lines ended by ``\\n``, paragraphs separated by a blank line;
    ``""`` for a page without text."""
    words: tuple[Word, ...]
    """Every word, in reading order."""
    hocr_path: Path | None = None
    """The page as an hOCR document, when asked for and the engine makes one."""
    pdf_path: Path | None = None
    """The page image with an invisible text layer, when asked for and the engine makes one."""

    @property
    def mean_confidence(self) -> float | None:
        """Mean of the word confidences (0–100), ``None`` without words: the measure escalation
        compares."""
        if not self.words:
            return None
        return sum(word.conf for word in self.words) / len(self.words)


class OcrEngine(Protocol):
    """An OCR engine: recognises one page image at a time."""

    name: str

    def recognise(
        self,
        image_path: Path,
        *,
        languages: list[str],
        dpi: int,
        hocr: bool = False,
        pdf: bool = False,
    ) -> PageText:
        """Recognises the page in ``image_path`` (8-bit grey PNG written by the caller, ``dpi``
        pixels per inch) in ``languages``; writes any hOCR or PDF beside it.

        Raises:
            hypermedia.core.errors.DomainError: ``OCR_PAGE_TIMEOUT`` (the page took too long), or
                another code the engine documents.
        """
        ...
