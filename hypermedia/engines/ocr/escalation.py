"""Escalation: when a page goes to the second engine, and which engine's reading is kept.

Pure Python (no engine is imported here): :mod:`hypermedia.engines.ocr.engine` runs the engines and asks
:func:`needs_escalation` and :func:`choose`.

**When.** A page whose tesseract words have a mean confidence under :data:`ESCALATION_THRESHOLD`
is read again by RapidOCR (:mod:`hypermedia.engines.ocr.rapid_ocr`), unless the job's ``escalate`` param
is false. A page without words is not: an empty page is the common case, and nothing is known to
compare.

**Which.** The two confidences are not on one scale even once both are 0–100. Tesseract's word
confidence comes from its LSTM's character probabilities, adjusted by its dictionary and
language model; RapidOCR's word score (times 100) is the mean of its CTC recogniser's per-character
maximum softmax probabilities, which run high on everything it reads: 98.8–99.4 on the corpus
pages, including the three-column 8071 page it reads at 73.7 % CER in its own line order (the
table below). Comparing the raw means would hand every escalated page to RapidOCR. So
:func:`choose` compares tesseract's mean with RapidOCR's mean *minus* :data:`RAPIDOCR_OFFSET`, the
gap between the two engines' means on pages both read well; and RapidOCR must have found at least
:data:`MIN_WORD_RATIO` of tesseract's words (RapidOCR's detector drops lines it cannot see, and a
reading that lost half the page is not better however sure it is of the rest). This is a
calibration from a handful of pages, recorded as such in every page's record (``confidences``
holds both raw means), not a proof; errors of reading order (a column read across) lower neither
engine's confidence.

Measured (tesseract 5.3 with ``eng``, tessdata_fast, after :mod:`hypermedia.engines.ocr.preprocess`;
RapidOCR 3.10 on the same preprocessed image; CER whitespace-normalised against the corpus' gold
texts; the degraded pages are ``phototest.tif`` made worse with libvips, as
``tests/unit/test_ocr_escalation.py`` makes them):

| page | tesseract mean conf | tesseract CER | RapidOCR mean conf | RapidOCR CER |
|---|---|---|---|---|
| phototest.tif | 96.4 | 0.0 % | 98.9 | 0.0 % |
| eurotext.tif (6 languages) | 94.3 | 0.5 % | 99.5 | 0.5 % |
| 8071_093.3B.tif | 95.4 | 4.9 % | 99.1 | 3.5 % |
| blurred, σ = 2 px | 96.3 | 0.0 % | 98.7 | 0.7 % |
| blurred, σ = 2.5 px | 27.5 | 99.3 % | 97.8 | 3.2 % |
| blurred, σ = 3 px | 42.3 | 100 % | 98.0 | 4.6 % |
| ½ size, JPEG quality 5 | 89.3 | 2.1 % | 98.7 | 1.1 % |
| ½ size, JPEG quality 3 | 69.2 | 13.4 % | 98.0 | 5.6 % |
| ½ size at 100 dpi, blurred σ = 1.2 px | 31.9 | 99.3 % | 98.7 | 1.4 % |
| 0.4 size at 80 dpi, blurred σ = 0.8 px | 31.5 | 98.9 % | 99.7 | 1.1 % |
| 0.35 size, low contrast | 96.3 | 0.0 % | 99.1 | 0.0 % |
| low contrast (grey 150–214) with noise σ = 25 | no words | 100 % | no words | 100 % |

Hence :data:`ESCALATION_THRESHOLD` 90: under every clean corpus page (94.3–96.4, so none of them
pays for a second engine) and above every degraded page RapidOCR read better (27.5–89.3). And
:data:`RAPIDOCR_OFFSET` 5: RapidOCR's mean exceeds tesseract's by 2.3–5.2 on the pages both read
equally well, so tesseract keeps a page it reads that well (the σ = 2 px page: 98.7 − 5 < 96.3,
where tesseract was the better) and loses the ones it reads badly.
RapidOCR's cost per escalated page: 0.9–1.2 s of CPU for these 640 × 480 pages, 12 s for the
3312 × 2550 8071 page, plus 1.6 s once per process for its imports and models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hypermedia.engines.ocr.recognition import PageText

__all__ = [
    "ESCALATION_THRESHOLD",
    "MIN_WORD_RATIO",
    "RAPIDOCR_OFFSET",
    "Choice",
    "choose",
    "needs_escalation",
]

ESCALATION_THRESHOLD: Final = 90.0
"""Mean word confidence (tesseract's, 0–100) under which a page is read again by RapidOCR."""

RAPIDOCR_OFFSET: Final = 5.0
"""Subtracted from RapidOCR's mean confidence before it is compared with tesseract's."""

MIN_WORD_RATIO: Final = 0.8
"""Least number of words RapidOCR must find, as a share of tesseract's, to be kept. A guard, not
a measurement: no page of the table above triggers it (RapidOCR found 48–60 of phototest's 60
words where tesseract found 1 or 60)."""


def needs_escalation(page: PageText, threshold: float = ESCALATION_THRESHOLD) -> bool:
    """True when ``page`` (tesseract's reading) has words and their mean confidence is under
    ``threshold``."""
    mean = page.mean_confidence
    return mean is not None and mean < threshold


@dataclass(frozen=True)
class Choice:
    """The reading kept for one escalated page, and why."""

    kept: PageText
    """The winner (its ``engine`` says which)."""
    reason: str
    """``higher_confidence`` (RapidOCR's offset mean beat tesseract's), ``lower_confidence``,
    ``too_few_words`` (RapidOCR found under :data:`MIN_WORD_RATIO` of tesseract's words)."""


def choose(first: PageText, second: PageText) -> Choice:
    """Keeps ``first`` (tesseract's reading) or ``second`` (RapidOCR's), see the module docstring.

    Args:
        first: tesseract's reading, with words (the caller escalated it).
        second: RapidOCR's reading of the same page image.
    """
    first_mean = first.mean_confidence or 0.0
    second_mean = second.mean_confidence
    if second_mean is None or len(second.words) < MIN_WORD_RATIO * len(first.words):
        return Choice(first, "too_few_words")
    if second_mean - RAPIDOCR_OFFSET > first_mean:
        return Choice(second, "higher_confidence")
    return Choice(first, "lower_confidence")
