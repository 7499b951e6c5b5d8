"""The tesseract command-line program: recognition, orientation detection, installed languages.

Every call is one ``tesseract`` process, started without a shell (an argument list, file names
relative to the page's directory), with ``OMP_THREAD_LIMIT=1`` (tesseract's OpenMP threads make
one process slower, not faster, when every core already runs a slot: issue 6, and tesseract's own
FAQ on ``OMP_THREAD_LIMIT``) and a timeout after which it is killed. It inherits the sandbox
child's rlimits, uid and namespaces.

One recognition run writes every renderer asked for from the same layout analysis:
``tesseract page.png page -l eng --dpi 300 --psm 3 txt tsv [hocr] [pdf]`` (the names after the
options are tesseract's config files ``tessdata/configs/{txt,tsv,hocr,pdf}``, which switch on
``tessedit_create_txt`` and friends).

Formats read (tesseract 5.3, ``src/api/renderer.cpp`` and ``baseapi.cpp``; tessdoc "Command Line
Usage" and "Input formats"):

* **TSV**: a header line, then one row per element, tab-separated: ``level page_num block_num
  par_num line_num word_num left top width height conf text``. ``level`` is 1 page, 2 block,
  3 paragraph, 4 line, 5 word; boxes in pixels of the input image, origin top left; ``conf`` is the
  word's confidence 0–100 (a float since 5.0), ``-1`` on the levels above words.
* **OSD** (``--psm 0``, model ``osd.traineddata``), on stdout: ``Page number``, ``Orientation in
  degrees`` (how far the text is turned counter-clockwise), ``Rotate`` (the clockwise rotation
  that makes it upright), ``Orientation confidence``, ``Script``, ``Script confidence``. The
  orientation confidence is the difference between the log-likelihood scores of the best and the
  second-best of the four orientations over up to 250 sampled blobs (``src/ccmain/osdetect.cpp``,
  ``OSResults::update_best_orientation``); with fewer than 25 usable blobs tesseract prints "Too
  few characters. Skipping this page" and exits 1.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from opentelemetry import trace

from hypermedia.core.errors import CpuTimeExceeded, PermanentJobError, TransientError
from hypermedia.engines.contract import job_cpu_seconds_left
from hypermedia.engines.ocr.params import NOT_RECOGNITION_MODELS
from hypermedia.engines.ocr.recognition import PageText, Word

__all__ = [
    "EXECUTABLE",
    "OSD_MIN_CONFIDENCE",
    "OSD_MIN_CONFIDENCE_CLEAR_SCRIPT",
    "OSD_MIN_SCRIPT_CONFIDENCE",
    "Orientation",
    "Tesseract",
    "TesseractFailure",
    "detect_orientation",
    "has_osd",
    "installed_languages",
    "parse_osd",
    "parse_tsv",
    "version",
]

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

EXECUTABLE: Final = "tesseract"
"""Looked up on ``PATH`` (the sandbox child's ``PATH`` is ``/usr/local/bin:/usr/bin:/bin``)."""

OSD_MIN_CONFIDENCE: Final = 7.0
"""Orientation confidence from which a detected turn is trusted on its own: tesseract's
``min_orientation_margin`` (default 7, ``tesseract --print-parameters``), the margin its automatic
page segmentation with OSD (``--psm 1``) trusts. Measured here, on pages upscaled to 300 dpi:
8.9–10.1 for the corpus' ``phototest.tif`` turned by 90, 180 or 270 degrees, 10.4–31.6 for the
other corpus pages, upright or turned. Below it, see :data:`OSD_MIN_CONFIDENCE_CLEAR_SCRIPT`."""

OSD_MIN_CONFIDENCE_CLEAR_SCRIPT: Final = 2.0
"""Orientation confidence from which a detected turn is trusted when the script is clear (script
confidence at least :data:`OSD_MIN_SCRIPT_CONFIDENCE`).

The orientation confidence is a sum over the blobs tesseract samples (at most 250,
``osdetect.cpp``) of each blob's log-likelihood margin, so it measures how much text a page has
as much as how right the detection is. On clean print typeset here (a paragraph of 8, 16, 32 or
64 words in DejaVu Serif, Sans and Mono at 9, 12 and 20 pt, 300 dpi, every quarter turn: 144
pages) the detection was right every time, at 1.1–3.7 for 8 words, 2.0–7.6 for 16, 4.3–15.6 for
32 and 9.9–30.4 for 64, so tesseract's margin of 7 alone trusted none of the 8-word pages, 3 of
36 of the 16-word and 17 of 36 of the 32-word ones: the others were read upside down or not at
all (issue 15, item 11). Wrong detections (the corpus' nine photos; ``phototest.tif`` blurred by
σ 3–4.5 px or faded to a quarter of its contrast under noise; ``8071_093.3B.tif`` blurred by σ
4 px; each in every quarter turn) came at 0.01–3.84, those over 2 with a script confidence of
0.09–2.05 (blobs of noise match no one script: "Bengali" at 0.44 on the faded phototest page).
The right detections between 2 and 7 had script confidences of 2.0 (8 of 66: Sans at 20 pt and
Mono, 8 or 16 words; and a 17-word Serif paragraph at 20 pt, upright and upside down) or 6.7–97:
a script confidence is a ratio of counts of blobs, coarse on a short text. With both rules, 12
of the 36 pages of 8 words, 30 of 36 of 16 and all of 32 words or more are turned; a shorter
text may stay as it is found."""

OSD_MIN_SCRIPT_CONFIDENCE: Final = 5.0
"""Script confidence (how far the best script's score exceeds the second's, in units of
tesseract's ``kScriptAcceptRatio`` 1.3 over 1) from which a page's text is taken to be in one
script, so that :data:`OSD_MIN_CONFIDENCE_CLEAR_SCRIPT` applies: between the wrong detections'
2.05 and the 6.7 of the right ones (measured, see there)."""

LIST_LANGS_TIMEOUT: Final = 10.0
"""Seconds ``tesseract --list-langs`` and ``--version`` may take (they read a directory)."""

_STDERR_TAIL: Final = 2000
WALL_FACTOR: Final = 3
"""Wall-clock limit of one tesseract run, in multiples of its CPU limit: a page needs its CPU
time, and waits for a core on a worker whose slots share the machine's."""
_TSV_COLUMNS: Final = 12
_WORD_LEVEL: Final = "5"
_OSD_FIELD: Final = re.compile(r"^([A-Za-z ]+):\s*(\S+)\s*$", re.MULTILINE)
_ALLOCATION_FAILED: Final = re.compile(r"bad_alloc|cannot allocate|out of memory|failed to allocate")


class TesseractFailure(RuntimeError):
    """Tesseract exited with an error on input this module wrote itself: a bug or a broken
    installation, not the caller's input. The message has the exit status and the end of stderr
    (for the worker's log; the job fails ``INTERNAL``)."""


def _environment() -> dict[str, str]:
    """The child's environment: ``PATH``, the locale, ``TESSDATA_PREFIX`` when set (a container
    may keep its models elsewhere), and ``OMP_THREAD_LIMIT=1``."""
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "TESSDATA_PREFIX" in os.environ:
        env["TESSDATA_PREFIX"] = os.environ["TESSDATA_PREFIX"]
    env["OMP_THREAD_LIMIT"] = "1"
    return env


def _executable() -> str:
    path = shutil.which(EXECUTABLE, path=_environment()["PATH"])
    if path is None:
        raise TransientError("The OCR engine is not installed on this worker.", "OCR_ENGINE_UNAVAILABLE")
    return path


def _run(
    argv: list[str], *, cwd: Path | None, timeout: float, what: str, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Runs tesseract with ``timeout`` seconds of CPU time, or what is left of the job's when
    that is less (:func:`job_cpu_seconds_left`; its own ``RLIMIT_CPU``, set with ``prlimit`` as it
    starts), and :data:`WALL_FACTOR` times ``timeout`` of wall time; maps its death to the job's
    error. CPU time does not depend on how busy the machine is, so a page that runs out of it
    would again: permanent; only an overloaded machine makes the wall limit the first.

    Raises:
        PermanentJobError: ``OCR_PAGE_TIMEOUT`` when the page used ``timeout`` CPU seconds.
        CpuTimeExceeded: ``TIMEOUT`` when what was left of the job's CPU time was the lower and
            tesseract used it up, or nothing was left.
        TransientError: ``TIMEOUT`` after ``WALL_FACTOR × timeout`` seconds of wall time (the
            process is killed; the worker was overloaded).
        MemoryError: tesseract was killed by SIGKILL (the kernel's or the cgroup's OOM killer),
            or aborted saying it could not allocate (``std::bad_alloc`` under the sandbox's
            ``RLIMIT_AS``).
        TesseractFailure: another non-zero exit while ``check``.
    """
    executable = _executable()
    inherited_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    cpu_seconds = max(1, math.ceil(timeout))
    left = job_cpu_seconds_left()
    if left < 1:  # RLIMIT_CPU is in whole seconds: less than one cannot be given
        raise CpuTimeExceeded()
    page_limit = cpu_seconds < left
    limit = cpu_seconds if page_limit else math.floor(left)  # never past the job's
    process = subprocess.Popen(
        [executable, *argv],
        cwd=cwd,
        env=_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with process:
        hard = limit + 1 if inherited_hard == resource.RLIM_INFINITY else min(limit + 1, inherited_hard)
        with contextlib.suppress(ProcessLookupError):  # it may be done already
            resource.prlimit(process.pid, resource.RLIMIT_CPU, (limit, hard))
        try:
            stdout, stderr = process.communicate(timeout=WALL_FACTOR * timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise TransientError(
                f"OCR of {what} took longer than {WALL_FACTOR * timeout:g} s of wall time.", "TIMEOUT"
            ) from None
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if done.returncode < 0:
        signum = -done.returncode
        if signum == signal.SIGXCPU and page_limit:
            raise PermanentJobError(
                f"OCR of {what} took longer than {cpu_seconds} s of CPU time.", "OCR_PAGE_TIMEOUT"
            )
        if signum == signal.SIGXCPU:  # what was left of the job's CPU time, less than the page's
            raise CpuTimeExceeded()
        text = done.stderr.decode("utf-8", "replace").lower()
        if signum == signal.SIGKILL or (signum == signal.SIGABRT and _ALLOCATION_FAILED.search(text)):
            raise MemoryError(f"tesseract died of signal {signum} on {what} (memory limit)")
    if check and done.returncode != 0:
        raise TesseractFailure(
            f"tesseract exited with {done.returncode} on {what}: "
            f"{done.stderr[-_STDERR_TAIL:].decode('utf-8', 'replace')}"
        )
    return done


@functools.cache
def _models() -> frozenset[str]:
    """Every model ``tesseract --list-langs`` lists, ``osd`` included. Cached for the life of the
    process: models are installed with the container."""
    done = _run(["--list-langs"], cwd=None, timeout=LIST_LANGS_TIMEOUT, what="--list-langs")
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    # The first line is 'List of available languages in "/usr/share/tesseract-ocr/5/tessdata/" (7):'.
    return frozenset(line.strip() for line in lines[1:] if line.strip())


def installed_languages() -> tuple[str, ...]:
    """The recognition languages tesseract has (``tesseract --list-langs``), sorted, without
    :data:`~hypermedia.engines.ocr.params.NOT_RECOGNITION_MODELS` (``osd``, ``equ``); read once per process.

    Returns:
        e.g. ``("deu", "eng", "fra", "ita", "por", "spa")``.

    Raises:
        TransientError: ``OCR_ENGINE_UNAVAILABLE`` when tesseract is not installed.
        TesseractFailure: ``--list-langs`` failed.
    """
    return tuple(sorted(_models() - NOT_RECOGNITION_MODELS))


def has_osd() -> bool:
    """True when the orientation and script model (``osd.traineddata``) is installed."""
    return "osd" in _models()


@functools.cache
def version() -> str:
    """Tesseract's version (``"5.3.0"``), from the first line of ``tesseract --version``."""
    done = _run(["--version"], cwd=None, timeout=LIST_LANGS_TIMEOUT, what="--version")
    first = (done.stdout or done.stderr).decode("utf-8", "replace").splitlines()[:1]
    return first[0].removeprefix("tesseract").strip() if first else ""


def parse_tsv(data: str) -> list[Word]:
    """The words of a tesseract TSV (see the module docstring), in the file's (reading) order.

    Rows of other levels, words that are only white space and malformed rows are skipped.
    Confidences are rounded to two decimals.
    """
    words: list[Word] = []
    for row in data.splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) < _TSV_COLUMNS or fields[0] != _WORD_LEVEL:
            continue
        text = "\t".join(fields[11:]).strip()
        if not text:
            continue
        try:
            block, par, line, word, left, top, width, height = (int(f) for f in fields[2:10])
            conf = round(float(fields[10]), 2)
        except ValueError:
            continue
        words.append(Word(text, (left, top, width, height), conf, block, par, line, word))
    return words


@dataclass(frozen=True)
class Orientation:
    """Tesseract's orientation and script detection of one page."""

    rotate: int
    """Clockwise rotation (0, 90, 180, 270 degrees) that makes the text upright."""
    orientation: int
    """How far the text is turned counter-clockwise (``360 - rotate``, modulo 360)."""
    confidence: float
    """Orientation confidence (see the module docstring and :attr:`trusted`)."""
    script: str
    """Detected script (``Latin``, ``Cyrillic``, ``Han``…)."""
    script_confidence: float
    """How clearly the page is in that one script (see :data:`OSD_MIN_SCRIPT_CONFIDENCE`)."""

    @property
    def trusted(self) -> bool:
        """Whether a page should be turned by :attr:`rotate`: its confidence is at least
        :data:`OSD_MIN_CONFIDENCE`, or at least :data:`OSD_MIN_CONFIDENCE_CLEAR_SCRIPT` with a
        script confidence of at least :data:`OSD_MIN_SCRIPT_CONFIDENCE`."""
        if self.confidence >= OSD_MIN_CONFIDENCE:
            return True
        return (
            self.confidence >= OSD_MIN_CONFIDENCE_CLEAR_SCRIPT
            and self.script_confidence >= OSD_MIN_SCRIPT_CONFIDENCE
        )


def parse_osd(output: str) -> Orientation | None:
    """Reads ``tesseract --psm 0`` output (see the module docstring); ``None`` when a field is
    missing or the rotation is not a multiple of 90."""
    fields = dict(_OSD_FIELD.findall(output))
    try:
        rotate = int(fields["Rotate"])
        orientation = int(fields["Orientation in degrees"])
        confidence = float(fields["Orientation confidence"])
        script_confidence = float(fields.get("Script confidence", "0"))
    except (KeyError, ValueError):
        return None
    if rotate not in (0, 90, 180, 270):
        return None
    return Orientation(rotate, orientation, confidence, fields.get("Script", ""), script_confidence)


def detect_orientation(image_path: Path, *, timeout: float, what: str = "a page") -> Orientation | None:
    """Orientation and script of the page in ``image_path`` (``tesseract --psm 0``).

    Returns:
        The detection, or ``None`` when tesseract found too few characters to decide (an empty
        page, a photo) or failed otherwise (logged): orientation is an improvement, never a reason
        to fail a page.

    Raises:
        PermanentJobError: ``OCR_PAGE_TIMEOUT``; and see :func:`_run` for signals.
    """
    with _tracer.start_as_current_span("tesseract.osd"):
        done = _run(
            [image_path.name, "-", "--psm", "0", "-l", "osd"],
            cwd=image_path.parent,
            timeout=timeout,
            what=what,
            check=False,
        )
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace")
        if "Too few characters" not in stderr:
            log.warning("tesseract OSD exited with %s: %s", done.returncode, stderr[-_STDERR_TAIL:])
        return None
    return parse_osd(done.stdout.decode("utf-8", "replace"))


class Tesseract:
    """The tesseract engine (:class:`hypermedia.engines.ocr.recognition.OcrEngine`)."""

    name = "tesseract"

    def __init__(self, *, timeout_seconds: float) -> None:
        """Args:
        timeout_seconds: CPU seconds one tesseract run may take (``OCR_PAGE_TIMEOUT`` after),
            and :data:`WALL_FACTOR` times that in wall time (``TIMEOUT`` after).
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
    ) -> PageText:
        """One tesseract run on ``image_path`` with ``--psm 3`` (automatic page segmentation, no
        OSD: orientation is corrected before), writing ``txt`` and ``tsv`` and, when asked,
        ``hocr`` and ``pdf`` beside the image (same stem).

        Args:
            image_path: the page; its directory is the working directory.
            languages: tesseract codes, checked by :mod:`hypermedia.engines.ocr.params` (never options).
            dpi: the page's resolution, passed as ``--dpi`` (tesseract's size heuristics and the
                PDF page size, ``pixels / dpi`` inches, depend on it).
            hocr, pdf: also write ``{stem}.hocr`` / ``{stem}.pdf``.
            what: names the page in error messages (``page 3``).

        Raises:
            PermanentJobError: ``OCR_PAGE_TIMEOUT``.
            CpuTimeExceeded: ``TIMEOUT`` (the job's ``RLIMIT_CPU``).
            MemoryError: tesseract was killed (see :func:`_run`).
            TesseractFailure: another failure.
        """
        stem = image_path.stem
        renderers = ["txt", "tsv"] + (["hocr"] if hocr else []) + (["pdf"] if pdf else [])
        argv = [image_path.name, stem, "-l", "+".join(languages), "--dpi", str(dpi), "--psm", "3", *renderers]
        attributes: dict[str, str | int] = {
            "languages": "+".join(languages),
            "dpi": dpi,
            "renderers": ",".join(renderers),
        }
        with _tracer.start_as_current_span("tesseract.recognise", attributes=attributes):
            done = _run(argv, cwd=image_path.parent, timeout=self.timeout_seconds, what=what)
        directory = image_path.parent
        missing = [r for r in renderers if not (directory / f"{stem}.{r}").is_file()]
        if missing:
            # Exit 0 without the file: the models directory lacks the renderer's config
            # (configs/tsv, configs/hocr) or pdf.ttf ("read_params_file: Can't open tsv").
            raise TesseractFailure(
                f"tesseract wrote no {', '.join(missing)} output on {what} (does the models "
                f"directory hold configs/ and pdf.ttf?): "
                f"{done.stderr[-_STDERR_TAIL:].decode('utf-8', 'replace')}"
            )
        text = (directory / f"{stem}.txt").read_text(encoding="utf-8", errors="replace")
        words = parse_tsv((directory / f"{stem}.tsv").read_text(encoding="utf-8", errors="replace"))
        return PageText(
            engine=self.name,
            text=text.replace("\f", "").strip("\n").rstrip(),
            words=tuple(words),
            hocr_path=directory / f"{stem}.hocr" if hocr else None,
            pdf_path=directory / f"{stem}.pdf" if pdf else None,
        )
