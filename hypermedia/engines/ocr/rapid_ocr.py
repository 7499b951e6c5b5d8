"""RapidOCR: the second engine, for pages tesseract reads poorly (escalation, issue 6).

RapidOCR (PyPI ``rapidocr`` 3.10, Apache-2.0) runs PaddleOCR's models with onnxruntime. Its wheel
carries the three models it uses by default (``rapidocr/models/``: ``PP-OCRv6_det_small.onnx``
9.9 MB, ``PP-OCRv6_rec_small.onnx`` 21 MB, ``ch_ppocr_mobile_v2.0_cls_mobile.onnx`` 0.6 MB), so it
runs with no network at all (checked in an empty network namespace, ``unshare -n``); it would
download only models other than those, which this module never asks for. Its recogniser's
character set covers Chinese and Latin with accents: the corpus' ``eurotext.tif`` (six European
languages) reads at 0.5 % CER.

Pipeline (``rapidocr/main.py``): the page is scaled to at most ``max_side_len`` (2000) pixels per
side; a DB detector finds text lines (quadrilaterals); a classifier turns lines read upside down;
a CRNN/SVTR recogniser reads each line as a sequence of characters with a softmax probability
each. With ``return_word_box`` every line is also split into words, each with a box (four points,
in pixels of the page given) and a score: the mean of its characters' probabilities (0–1). There
is no layout analysis: lines come in top-to-bottom order across the whole page, so on a
multi-column page (the corpus' 8071 page, three columns) the plain line order mixes the columns
(73.7 % CER). :func:`reading_order` therefore orders the words by the blocks of tesseract's run
on the same page when that run found enough words (:data:`LAYOUT_MIN_WORDS`): 3.5 % CER on the
8071 page, against tesseract's 4.9 %.

Threads: onnxruntime runs with ``intra_op_num_threads=1`` and ``inter_op_num_threads=1`` (its
default is one thread per core), OpenCV with ``cv2.setNumThreads(1)``, and OpenBLAS (numpy's) and
OpenMP get ``OPENBLAS_NUM_THREADS=1``/``OMP_NUM_THREADS=1`` before numpy is first imported: the
process then has 2 tasks while RapidOCR runs (measured from ``/proc/self/task``; one is
onnxruntime's), where the defaults give one more per core, which the sandbox's ``RLIMIT_NPROC``
(16 per uid, threads included) cannot afford on a large machine. The imports are deferred to the
first page (importing ``rapidocr`` costs 1.6 s of CPU, mostly parsing its model catalogue), so
importing this module is cheap and fork-safe, and a job that escalates nothing pays nothing.

Cost, measured here on one core: 1.4 s of CPU for ``phototest.tif`` (640 × 480), 1.8 s for
``eurotext.tif``, 11.6 s for the 3312 × 2550 8071 page; plus 1.6 s once per process for the
imports and model loads.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import statistics
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from opentelemetry import trace

from hypermedia.core.errors import DomainError, PermanentJobError
from hypermedia.engines.ocr.recognition import PageText, Word

__all__ = [
    "LAYOUT_MIN_WORDS",
    "MAX_SIDE_LEN",
    "THREAD_ENVIRONMENT",
    "RapidOcrEngine",
    "blocks_of",
    "page_text",
    "reading_order",
    "version",
]

_tracer = trace.get_tracer(__name__)

MAX_SIDE_LEN: Final = 2000
"""Longest side, in pixels, RapidOCR scales a page down to before detection (its default). 4000
costs 19.5 s instead of 11.6 s of CPU on the 8071 page for no gain (measured)."""

THREAD_ENVIRONMENT: Final = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""Set (unless already set) before numpy, OpenCV and onnxruntime are imported: one thread each."""

LAYOUT_MIN_WORDS: Final = 0.5
"""Least number of words the other engine must have found, as a share of RapidOCR's, for its
blocks to order RapidOCR's words. A run that found few words has no layout worth following: on
``phototest.tif`` blurred (σ = 3 px) tesseract finds one "word" whose box covers half the page,
and ordering by it cut every line in two (53 % CER, against 3.9 % in RapidOCR's line order)."""

_PARAGRAPH_GAP: Final = 1.0
"""A vertical gap between two lines of a block larger than this many median line heights starts a
new paragraph."""


@functools.cache
def _rapidocr() -> Any:
    """Imports RapidOCR with one thread per library and builds the engine (models load lazily, on
    the first page). Cached for the life of the process."""
    for name, value in THREAD_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    import cv2

    cv2.setNumThreads(1)
    from rapidocr import RapidOCR

    return RapidOCR(
        params={
            "Global.log_level": "error",
            "Global.max_side_len": MAX_SIDE_LEN,
            "EngineConfig.onnxruntime.intra_op_num_threads": 1,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    )


def _domain_cause(exc: BaseException) -> DomainError | None:
    """The :class:`DomainError` among ``exc``'s causes and contexts (RapidOCR re-raises what
    happened in onnxruntime's call as its own ``ONNXRuntimeError``, :func:`_deadline`'s too)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DomainError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@functools.cache
def version() -> str:
    """RapidOCR's version (``"3.10.0"``), from the installed distribution."""
    from importlib.metadata import version as distribution_version

    return distribution_version("rapidocr")


@contextlib.contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raises ``OCR_PAGE_TIMEOUT`` in the main thread after ``seconds`` of wall time (a real-time
    timer, ``SIGALRM``). Python runs the handler between bytecodes, so the longest onnxruntime call
    (the detector on one page, at most a few seconds) finishes first; the sandbox's ``RLIMIT_CPU``
    is the backstop. Off the main thread there is no timer."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise PermanentJobError(f"OCR of {what} took longer than {seconds:g} s.", "OCR_PAGE_TIMEOUT")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class _RawWord:
    text: str
    bbox: tuple[int, int, int, int]
    conf: float
    line: int
    """Index of RapidOCR's line (0-based, its top-to-bottom order)."""


def _raw_words(output: Any) -> list[_RawWord]:
    """The words of a ``RapidOCROutput``: ``word_results`` is one tuple per line of ``(text, score
    0–1, [[x, y] × 4])``; a score becomes 0–100 and the four points their axis-aligned box. A
    word with white space in it (RapidOCR splits Latin lines at spaces, Chinese ones per
    character) is split, each part keeping the box and score."""
    if not output.txts:
        return []
    words: list[_RawWord] = []
    for index, line in enumerate(output.word_results):
        for text, score, points in line:
            if not text or not text.strip() or points is None:
                continue
            xs = [round(float(p[0])) for p in points]
            ys = [round(float(p[1])) for p in points]
            bbox = (min(xs), min(ys), max(1, max(xs) - min(xs)), max(1, max(ys) - min(ys)))
            for part in text.split():
                words.append(_RawWord(part, bbox, round(float(score) * 100, 2), index))
    return words


def reading_order(words: Sequence[_RawWord], blocks: Sequence[tuple[int, int, int, int]]) -> list[Word]:
    """RapidOCR's words with block, paragraph, line and word numbers, in reading order.

    Args:
        words: RapidOCR's words, in its order (line by line, top to bottom, then left to right).
        blocks: ``(x, y, width, height)`` of each text block in reading order, in the same page's
            pixels (tesseract's blocks, see :func:`blocks_of`); empty for none.

    Returns:
        Every word once. A word belongs to the first block that contains its centre, or to a block
        of its own after the others (by RapidOCR's line) when none does; within a block, words keep
        RapidOCR's lines (a line that crossed a column gap is so cut in two) and are ordered left
        to right; a new paragraph starts at a vertical gap over :data:`_PARAGRAPH_GAP` median line
        heights.
    """
    grouped: dict[tuple[int, int], list[_RawWord]] = {}
    for word in words:
        cx, cy = word.bbox[0] + word.bbox[2] / 2, word.bbox[1] + word.bbox[3] / 2
        block = next(
            (i for i, (x, y, w, h) in enumerate(blocks) if x <= cx <= x + w and y <= cy <= y + h),
            len(blocks),
        )
        grouped.setdefault((block, word.line), []).append(word)
    lines = [sorted(line, key=lambda w: w.bbox[0]) for _, line in sorted(grouped.items())]
    heights = [max(w.bbox[3] for w in line) for line in lines]
    median_height = statistics.median(heights) if heights else 0
    result: list[Word] = []
    block_number, previous_block, par, line_number, previous_bottom = 0, -1, 0, 0, 0
    for (block, _), line in zip(sorted(grouped), lines, strict=True):
        top = min(w.bbox[1] for w in line)
        if block != previous_block:
            block_number, previous_block, par, line_number = block_number + 1, block, 1, 0
        elif top - previous_bottom > _PARAGRAPH_GAP * median_height:
            par, line_number = par + 1, 0
        line_number += 1
        previous_bottom = max(w.bbox[1] + w.bbox[3] for w in line)
        for number, word in enumerate(line, start=1):
            result.append(Word(word.text, word.bbox, word.conf, block_number, par, line_number, number))
    return result


def blocks_of(words: Sequence[Word]) -> list[tuple[int, int, int, int]]:
    """The boxes ``(x, y, width, height)`` of the blocks of an engine's words (the union of each
    block's word boxes), in the order the blocks first appear."""
    boxes: dict[int, list[int]] = {}
    for word in words:
        x, y, w, h = word.bbox
        box = boxes.setdefault(word.block, [x, y, x + w, y + h])
        box[0], box[1] = min(box[0], x), min(box[1], y)
        box[2], box[3] = max(box[2], x + w), max(box[3], y + h)
    return [(x0, y0, x1 - x0, y1 - y0) for x0, y0, x1, y1 in boxes.values()]


def page_text(words: Sequence[Word]) -> str:
    """Plain text as :attr:`PageText.text` has it: a line per line, a blank line between
    paragraphs and between blocks."""
    parts: list[str] = []
    previous: tuple[int, int, int] | None = None
    for word in words:
        key = (word.block, word.par, word.line)
        if previous is None:
            pass
        elif key[:2] != previous[:2]:
            parts.append("\n\n")
        elif key != previous:
            parts.append("\n")
        else:
            parts.append(" ")
        parts.append(word.text)
        previous = key
    return "".join(parts)


class RapidOcrEngine:
    """RapidOCR as an :class:`hypermedia.engines.ocr.recognition.OcrEngine`, in this process.

    Its words' ``conf`` is RapidOCR's word score times 100 (0–100, as tesseract's), boxes in
    pixels of the image given, ids from :func:`reading_order`. It makes no hOCR and no PDF:
    ``hocr_path`` and ``pdf_path`` stay ``None`` whatever is asked.
    """

    name = "rapidocr"

    def __init__(self, *, timeout_seconds: float) -> None:
        """Args:
        timeout_seconds: wall-clock seconds one page may take (``OCR_PAGE_TIMEOUT`` after),
            the first page's imports and model loads included.
        """
        self.timeout_seconds = timeout_seconds

    def recognise(
        self,
        image_path: Path,
        *,
        languages: list[str],
        dpi: int,
        hocr: bool = False,
        pdf: bool = False,
        what: str = "a page",
        layout: Sequence[Word] = (),
    ) -> PageText:
        """Reads the page in ``image_path`` (8-bit grey, any size).

        Args:
            languages, dpi, hocr, pdf: accepted for the protocol and unused: RapidOCR's models
                read Chinese and Latin scripts whatever the language, at any resolution.
            what: names the page in error messages.
            layout: another engine's words on the same image (tesseract's), whose blocks give the
                reading order when there are at least :data:`LAYOUT_MIN_WORDS` as many as
                RapidOCR's; otherwise (or empty) RapidOCR's line order is kept.

        Raises:
            PermanentJobError: ``OCR_PAGE_TIMEOUT``.
            MemoryError: onnxruntime could not allocate (the sandbox's ``RLIMIT_AS``).
            RuntimeError: OpenCV could not read the image.
        """
        with _deadline(self.timeout_seconds, what), _tracer.start_as_current_span("rapidocr.recognise"):
            engine = _rapidocr()
            import cv2

            image = cv2.imread(str(image_path), cv2.IMREAD_GRAYSCALE)
            if image is None:  # the caller wrote it as PNG: a bug, or OpenCV out of memory
                raise RuntimeError(f"OpenCV could not read the image of {what}")
            try:
                output = engine(image, return_word_box=True)
            except Exception as exc:  # onnxruntime raises its own RuntimeException types
                deadline = _domain_cause(exc)
                if deadline is not None:  # the timer fired inside RapidOCR, which wrapped it
                    raise deadline from None
                if "alloc" in str(exc).lower():
                    raise MemoryError(f"RapidOCR ran out of memory on {what}") from exc
                raise
        raw = _raw_words(output)
        blocks = blocks_of(layout) if len(layout) >= LAYOUT_MIN_WORDS * len(raw) else []
        words = reading_order(raw, blocks)
        return PageText(engine=self.name, text=page_text(words), words=tuple(words))
