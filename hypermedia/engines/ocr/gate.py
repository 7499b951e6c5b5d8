"""When a page pays for tesseract's orientation detection (issue 17, P5; ADR 0039).

The orientation detection (``tesseract --psm 0``, :func:`hypermedia.engines.ocr.tesseract.detect_orientation`)
is a second tesseract process with its own layout analysis: 0.5–1.1 s a page on the corpus, as
much as recognising the page itself, and on an upright page it finds nothing to do. The engine
therefore prepares a page with ``orientation="gated"`` (:func:`hypermedia.engines.ocr.preprocess.prepare`):

1. **Text-line direction** (free: the measurement the upscale step makes anyway,
   :func:`hypermedia.engines.ocr.preprocess.line_direction`). Lines that run down the page (a page
   turned by a quarter turn), or no clear direction (a photo, a page of a few words): the
   detection runs before recognition, as it always did.
2. **First reading.** Lines across the page: the page is upright or upside down, which the
   profile cannot tell. It is read as it is; tesseract reads an upside-down page as noise with a
   low mean word confidence (measured: 38.9–62.7 on the corpus pages turned by 180°, against
   93.7–96.2 upright). A reading with words whose mean confidence is at least
   :data:`ORIENTATION_GATE_CONFIDENCE` is kept: no detection ran.
3. **Otherwise** (:func:`needs_orientation`) the page is prepared again with the detection; when
   the detection turns it, the turned page is read again and :func:`keeps_turned` picks the
   reading kept; when it does not, the first reading stands (the page is the same one) and only
   the orientation record changes to the detection's.

Each page's record says what ran (:func:`gate_record`, ``gate`` in ``words.json``).
"""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.ocr.recognition import PageText

__all__ = [
    "ORIENTATION_GATE_CONFIDENCE",
    "gate_record",
    "keeps_turned",
    "needs_orientation",
    "orientation_step",
]

ORIENTATION_GATE_CONFIDENCE: Final = 85.0
"""Mean tesseract word confidence (0–100) from which a page whose text lines run across it is
taken as upright without the orientation detection. Clean upright corpus pages read at
93.7–96.2, the same pages upside down at 38.9–62.7 (eurotext with its six languages the
highest); an upright page under it (a poor scan) pays for the detection as every page did before."""


def orientation_step(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``orientation`` record of a page's preprocessing steps, or ``None`` (preprocessing off)."""
    return next((step for step in steps if step["step"] == "orientation"), None)


def needs_orientation(steps: list[dict[str, Any]], first: PageText) -> bool:
    """True when the page skipped the orientation detection for its horizontal text lines
    (``reason: "lines_horizontal"``) and its first reading is weak: no words, or a mean word
    confidence under :data:`ORIENTATION_GATE_CONFIDENCE`."""
    step = orientation_step(steps)
    if step is None or step.get("reason") != "lines_horizontal":
        return False
    mean = first.mean_confidence
    return mean is None or mean < ORIENTATION_GATE_CONFIDENCE


def keeps_turned(first: PageText, turned: PageText) -> bool:
    """True when the reading of the page as the orientation detection turned it is kept over the
    first reading (of the page as it was): it has words and a mean confidence at least the
    first's (or the first has none)."""
    if turned.mean_confidence is None:
        return False
    return first.mean_confidence is None or turned.mean_confidence >= first.mean_confidence


def gate_record(first: PageText, *, osd: bool, recognitions: int) -> dict[str, Any]:
    """The page's ``gate`` record: ``first_pass_confidence`` (0–100 or ``None``: the mean word
    confidence of the first reading), ``osd`` (whether tesseract's orientation detection ran on
    the page) and ``recognitions`` (tesseract recognition runs on the page: 1, or 2 when the page
    was turned after its first reading)."""
    mean = first.mean_confidence
    return {
        "first_pass_confidence": round(mean, 2) if mean is not None else None,
        "osd": osd,
        "recognitions": recognitions,
    }
