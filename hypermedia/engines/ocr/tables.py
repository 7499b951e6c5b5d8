"""Tables found in a page's OCR words: blocks classified as text or table, tables as rows and cells.

Tesseract's automatic page segmentation (``--psm 3``) cuts a borderless table into one block per
column (each column is a column of text to it), so block ids say nothing about rows; this module
works on word geometry alone, and on ruling lines when the page image is given.

Method (whitespace analysis on the x-projection of word boxes):

1. **Lines.** Words are grouped into lines by vertical overlap (at least half of the smaller
   height; a word that overlaps a word of the line horizontally starts another line), whatever
   block tesseract put them in, so the cells of one table row make one line.
2. **Segments.** A line is cut into segments at gaps between consecutive words of at least
   :data:`MIN_GAP_HEIGHTS` times the page's median word height (about one em: ordinary word
   spaces are a third of that), or at a vertical ruling line. A line with two or more segments
   may be a table row.
3. **Regions.** Runs of vertically adjacent multi-segment lines (the space between two lines at
   most :data:`MAX_ROW_GAP_HEIGHTS` median heights; a single-segment line between two of them is
   kept when it crosses none of the run's column separators: a row with one filled cell).
4. **Columns.** The x-projection of the run's word boxes: column separators are the intervals,
   at least the minimum gap wide (or holding a vertical rule), that no word of the run covers,
   and across which at least :data:`MIN_SEPARATOR_SUPPORT` lines have words on both sides. A
   column is the span between two separators, not a left edge, so right-aligned and centred
   columns are found like left-aligned ones, however narrow the gutter between a right-aligned
   column and a left-aligned one after it (down to the minimum gap). An
   interval that a few lines cover (at most :data:`MAX_SPANNING_SHARE` of the run's lines, and
   :data:`MAX_SPANNING_LINES`) is a separator too when each of those lines only reaches into it
   from a column beside it or across it, none with a segment inside it: a subtotal's label over
   the code and description columns does not merge them for every row, while a column with one
   filled cell stays a column. A line's words are cut into cells at wide gaps and at separators;
   a group of words reaching across a separator is one cell of its first word's column, with
   :attr:`Cell.span` the columns it covers (those are empty, span 0). A run of at least
   :data:`MIN_ROWS` lines with at least :data:`MIN_COLUMNS` columns, whose cells hold on average
   at most :data:`MAX_MEAN_CELL_WORDS` words (columns of prose hold whole lines), and with a
   column that is not running text (:data:`MIN_TEXT_COLUMN_WORDS`, :data:`TEXT_COLUMN_FILL`: a
   page of three narrow columns of ragged prose is not a table), is a table. Each column's
   alignment (left, right, centre) is the edge of its cells that varies least.
5. **Ruling lines** (``page_image`` given): dark runs at least :data:`MIN_RULE_HEIGHTS` median
   word heights long, found by eroding the ink mask with a line segment (log₂ steps of
   shift-and-AND in libvips) and projecting the result. Vertical rules inside a table are column
   separators even where the gap is narrow; when a table has interior vertical rules (a full
   grid), its horizontal rules bound the rows and every text line between two of them belongs
   to one row (cells of several lines). Horizontal rules alone (``booktabs`` style: top, header
   and bottom rules) do not split rows.
6. **Marks.** Words of no letter or digit (``-``, ``—``, ``_``, ``=``) take no part in steps 1–4:
   tesseract reads such a mark out of a blank gutter now and then (``_`` after a header word,
   ``—-`` or ``=`` between two cells, confidences 4–67 on the clean pages of the tests), which
   would bridge the gutter. After the columns are found, a mark whose middle lies in a separator
   is dropped (its block counts as the table's), and so is a dot leader (``........`` from a
   price list's item to its price, wherever it ends); another mark inside a column joins its cell
   (a ``-`` for nil).

Sources: the projection-profile / whitespace approach of T. Kieninger and A. Dengel, "The T-Recs
table recognition and analysis system" (DAS 1998, LNCS 1655) — blocks of words linked across
vertical whitespace, columns from consistent gaps; F. Shafait and R. Smith, "Table detection in
heterogeneous documents" (DAS 2010), the algorithm of tesseract's ``src/textord/tablefind.cpp``
(column partitions from whitespace, ruling lines from ``linefind.cpp`` to confirm cells);
R. Zanibbi, D. Blostein and J. Cordy, "A survey of table recognition" (IJDAR 7, 2004) for the
terms (separators, cells, spanning). Ruling-line detection by morphological opening with a line
structuring element is the method of ``linefind.cpp`` (Leptonica ``pixOpenBrick``).

Limits: cells spanning columns on more lines than :data:`MAX_SPANNING_SHARE` allows (a table of
merged headers) remove the separators they cross from the whole table; a line of one segment
across a separator (a note with no amount beside it) splits the table there and stays text; a
gutter narrower than the minimum gap (about 1.5 digit widths of DejaVu Sans) is not found, and a
mark tesseract glues to a word (``A-100__``) stays in its cell; cells of several lines without a
ruled grid become several rows; stacked tables with different columns and no text between them
are one table. Work is linear in the
number of words per line and quadratic at most in the lines of one run (bounded by the page).

Pure Python but for :func:`find_rules`, which runs libvips on the page image.
"""

from __future__ import annotations

import bisect
import csv
import io
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import pyvips

from hypermedia.engines.ocr.recognition import Word

__all__ = [
    "MAX_MEAN_CELL_WORDS",
    "MAX_ROW_GAP_HEIGHTS",
    "MAX_SPANNING_LINES",
    "MAX_SPANNING_SHARE",
    "MIN_COLUMNS",
    "MIN_GAP_HEIGHTS",
    "MIN_ROWS",
    "MIN_RULE_HEIGHTS",
    "MIN_SEPARATOR_SUPPORT",
    "MIN_TEXT_COLUMN_WORDS",
    "TEXT_COLUMN_FILL",
    "Align",
    "Block",
    "Cell",
    "Rule",
    "Table",
    "classify_blocks",
    "detect_tables",
    "find_rules",
    "to_csv",
    "to_json",
]

MIN_GAP_HEIGHTS: Final = 1.2
"""Narrowest column gap, in median word heights (a word's height is about 0.75 em: 1.2 heights is
about 0.9 em; a word space is about 0.3 em, a stretched one in justified text rarely 0.6 em)."""
MAX_ROW_GAP_HEIGHTS: Final = 3.0
"""Widest vertical space between two lines of one table, in median word heights (rows of ruled
tables are often set with a line of space or more between them)."""
MIN_ROWS: Final = 3
"""Fewest lines (rows) of a table."""
MIN_COLUMNS: Final = 3
"""Fewest columns of a table (two columns of words are as often a list or a form as a table)."""
MAX_SPANNING_SHARE: Final = 0.25
"""Largest share of a table's lines whose cells may span a column separator (a subtotal or a note
over several columns) without removing it; with :data:`MAX_SPANNING_LINES`, and none in a table
of fewer than 4 lines."""
MAX_SPANNING_LINES: Final = 3
"""Most lines of one table with cells spanning one separator."""
MIN_SEPARATOR_SUPPORT: Final = 2
"""Fewest lines that must have words on both sides of a column separator."""
MAX_MEAN_CELL_WORDS: Final = 5.0
"""Most words per filled cell, on average, of a table: columns of prose hold 8–12 words a line."""
MIN_TEXT_COLUMN_WORDS: Final = 3.0
"""Fewest words per filled cell, on average, of a column of running text (with
:data:`TEXT_COLUMN_FILL`): a table needs one column that is not (its codes, numbers, dates); a
page set in three narrow columns of prose (5–6 words a line) is not a table."""
TEXT_COLUMN_FILL: Final = 2 / 3
"""A column of running text: three quarters of its filled cells at least this share of its width
wide (lines broken to fill a measure)."""
MIN_RULE_HEIGHTS: Final = 4.0
"""Shortest ruling line, in median word heights (no letter stroke is that long)."""
INK_THRESHOLD: Final = 128
"""Grey level below which a pixel is ink, for ruling lines (pages reach this module grey, their
background normalised)."""
DEFAULT_WORD_HEIGHT: Final = 32
"""Median word height assumed without words, in pixels (10 pt text at 300 dpi)."""

Align = Literal["left", "right", "centre"]
"""How a column's cells are set: their left edges, right edges or middles line up."""

LEADER_DOTS: Final = frozenset(".·…•")
"""The characters of a dot leader (:func:`_is_leader`)."""

Box = tuple[int, int, int, int]
"""``(x, y, width, height)`` in pixels of the page image, origin top left (as :attr:`Word.bbox`)."""


@dataclass(frozen=True)
class Rule:
    """A ruling line of the page image."""

    orientation: Literal["horizontal", "vertical"]
    bbox: Box
    """The rule's extent; its thickness is the small side."""


@dataclass(frozen=True)
class Cell:
    """One cell of a table."""

    row: int
    """Row index, 0-based from the top."""
    col: int
    """Column index, 0-based from the left."""
    text: str
    """The cell's words joined by spaces (lines of a multi-line cell by ``\\n``); ``""`` when empty."""
    bbox: Box
    """The union of the cell's word boxes; for an empty cell the grid cell (its column's extent ×
    its row's extent)."""
    words: tuple[Word, ...] = ()
    """The cell's words, in reading order."""
    span: int = 1
    """How many columns it spans, from its own rightwards: a cell whose words reach across a
    column separator (a subtotal's label over two columns) is held by its first column; the
    cells it covers are empty, with span ``0``."""

    @property
    def conf(self) -> float | None:
        """Mean word confidence (0–100), ``None`` for an empty cell."""
        return sum(w.conf for w in self.words) / len(self.words) if self.words else None


@dataclass(frozen=True)
class Table:
    """A table found on one page."""

    bbox: Box
    """The union of the table's words and (when ruled) its rules."""
    rows: tuple[tuple[Cell, ...], ...]
    """Rows from the top, each with one cell per column from the left (empty cells included)."""
    columns: tuple[tuple[int, int], ...]
    """Each column's horizontal extent ``(x0, x1)`` in pixels (its words' extent, x1 exclusive)."""
    ruled: bool = False
    """Whether it is a ruled grid (vertical rules between its columns): then its rules separate
    the columns and bound the rows, and its box includes them."""
    block_ids: tuple[int, ...] = ()
    """Tesseract blocks that hold its words, sorted."""
    align: tuple[Align, ...] = ()
    """Each column's alignment, inferred from its filled cells (:func:`_alignment`)."""

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def n_cols(self) -> int:
        return len(self.columns)


@dataclass(frozen=True)
class Block:
    """A tesseract block (or the part of one outside or inside a table) and what it holds."""

    block_id: int
    """Tesseract's block number on the page (:attr:`Word.block`)."""
    kind: Literal["text", "table"]
    bbox: Box
    """The union of the block's words (in that kind)."""
    table: int | None = None
    """Index into :func:`detect_tables`' list for a ``table`` block."""

    def as_json(self) -> dict[str, Any]:
        """``{"block_id", "kind", "bbox": [x, y, w, h], "table": index | null}``."""
        return {"block_id": self.block_id, "kind": self.kind, "bbox": list(self.bbox), "table": self.table}


# --- geometry ------------------------------------------------------------------------------------


def _union(boxes: Iterable[Box]) -> Box:
    boxes = list(boxes)
    x0 = min(b[0] for b in boxes)
    y0 = min(b[1] for b in boxes)
    x1 = max(b[0] + b[2] for b in boxes)
    y1 = max(b[1] + b[3] for b in boxes)
    return (x0, y0, x1 - x0, y1 - y0)


def _inside(box: Box, outer: Box) -> bool:
    """Whether the middle of ``box`` lies in ``outer``."""
    mx, my = box[0] + box[2] / 2, box[1] + box[3] / 2
    return outer[0] <= mx < outer[0] + outer[2] and outer[1] <= my < outer[1] + outer[3]


@dataclass
class _Line:
    words: list[Word] = field(default_factory=list)
    top: int = 0
    bottom: int = 0

    def add(self, word: Word) -> None:
        _, y, _, h = word.bbox
        if not self.words:
            self.top, self.bottom = y, y + h
        else:
            self.top, self.bottom = min(self.top, y), max(self.bottom, y + h)
        self.words.append(word)

    @property
    def x0(self) -> int:
        return min(w.bbox[0] for w in self.words)

    @property
    def x1(self) -> int:
        return max(w.bbox[0] + w.bbox[2] for w in self.words)


def _group_lines(words: Sequence[Word]) -> list[_Line]:
    """Lines from the top, words in each from the left (see the module docstring, step 1)."""
    lines: list[_Line] = []
    for word in sorted(words, key=lambda w: (w.bbox[1] + w.bbox[3] / 2, w.bbox[0])):
        x, y, width, height = word.bbox
        home = None
        for line in reversed(lines[-3:]):
            overlap = min(y + height, line.bottom) - max(y, line.top)
            if overlap < 0.5 * min(height, line.bottom - line.top):
                continue
            if any(min(x + width, v.bbox[0] + v.bbox[2]) - max(x, v.bbox[0]) > 0 for v in line.words):
                continue
            home = line
            break
        if home is None:
            home = _Line()
            lines.append(home)
        home.add(word)
    for line in lines:
        line.words.sort(key=lambda w: w.bbox[0])
    lines.sort(key=lambda line: (line.top + line.bottom) / 2)
    return lines


def _crosses_rule(left: int, right: int, top: int, bottom: int, rules: Sequence[Rule]) -> bool:
    """Whether a vertical rule runs through the gap ``[left, right)`` at the height ``[top, bottom)``."""
    for rule in rules:
        x, y, w, h = rule.bbox
        if left <= x and x + w <= right and y < bottom and top < y + h:
            return True
    return False


def _segments(line: _Line, min_gap: float, v_rules: Sequence[Rule]) -> int:
    """How many segments the line has (step 2)."""
    count = 1
    for a, b in zip(line.words, line.words[1:], strict=False):
        left, right = a.bbox[0] + a.bbox[2], b.bbox[0]
        if right - left >= min_gap or _crosses_rule(left, right, line.top, line.bottom, v_rules):
            count += 1
    return count


def _pieces(line: _Line, min_gap: float) -> list[tuple[int, int]]:
    """The x-extents of the line's segments (words closer than ``min_gap`` joined)."""
    pieces: list[tuple[int, int]] = []
    for word in line.words:
        x0, x1 = word.bbox[0], word.bbox[0] + word.bbox[2]
        if pieces and x0 - pieces[-1][1] < min_gap:
            pieces[-1] = (pieces[-1][0], max(pieces[-1][1], x1))
        else:
            pieces.append((x0, x1))
    return pieces


def _spanned_gaps(lines: Sequence[_Line], min_gap: float, most: int) -> list[tuple[int, int]]:
    """Gaps that at most ``most`` lines cover, each of them with segments that reach into the gap
    from a column beside it or across it (a spanning cell: a subtotal's label over the code and
    description columns), none lying inside it (a column with one filled cell is a column, not a
    gap)."""
    events: list[tuple[int, int]] = []
    for line in lines:
        for word in line.words:
            events += [(word.bbox[0], 1), (word.bbox[0] + word.bbox[2], -1)]
    events.sort()
    regions: list[tuple[int, int]] = []
    depth, start = 0, None
    for x, step in events:
        before = depth
        depth += step
        if before > most >= depth:
            start = x
        elif depth > most >= before and start is not None:
            if x - start >= min_gap:
                regions.append((start, x))
            start = None
    gaps = []
    for r0, r1 in regions:
        over = [
            line for line in lines if any(w.bbox[0] < r1 and w.bbox[0] + w.bbox[2] > r0 for w in line.words)
        ]
        inside = [(p0, p1) for line in over for p0, p1 in _pieces(line, min_gap) if p0 < r1 and p1 > r0]
        if over and all(p0 < r0 or p1 > r1 for p0, p1 in inside):
            gaps.append((r0, r1))
    return gaps


def _separators(lines: Sequence[_Line], min_gap: float, v_rules: Sequence[Rule]) -> list[tuple[int, int]]:
    """Column separators of a run of lines (step 4): ``(x0, x1)`` intervals no word covers, or
    only segments of a few spanning lines (:data:`MAX_SPANNING_SHARE`) reaching across them."""
    spans = sorted((w.bbox[0], w.bbox[0] + w.bbox[2]) for line in lines for w in line.words)
    top, bottom = min(line.top for line in lines), max(line.bottom for line in lines)
    gaps: list[tuple[int, int]] = []
    reach = spans[0][1]
    for x0, x1 in spans[1:]:
        if x0 > reach and (x0 - reach >= min_gap or _crosses_rule(reach, x0, top, bottom, v_rules)):
            gaps.append((reach, x0))
        reach = max(reach, x1)
    most = min(MAX_SPANNING_LINES, int(len(lines) * MAX_SPANNING_SHARE))
    if most:
        spanned = _spanned_gaps(lines, min_gap, most)
        gaps = sorted(spanned + [g for g in gaps if not any(s0 <= g[0] and g[1] <= s1 for s0, s1 in spanned)])
    supported = []
    for gap in gaps:
        support = sum(1 for line in lines if line.x0 < gap[0] and line.x1 > gap[1] and len(line.words) > 1)
        if support >= MIN_SEPARATOR_SUPPORT:
            supported.append(gap)
    return supported


def _covers(line: _Line, separators: Sequence[tuple[int, int]]) -> bool:
    """Whether a word of the line reaches into a separator."""
    return any(w.bbox[0] < s1 and w.bbox[0] + w.bbox[2] > s0 for w in line.words for s0, s1 in separators)


def _runs(
    lines: Sequence[_Line], min_gap: float, max_row_gap: float, v_rules: Sequence[Rule]
) -> list[list[_Line]]:
    """Candidate regions (step 3): runs of adjacent multi-segment lines, with single-segment lines
    between two of them."""
    multi = [_segments(line, min_gap, v_rules) >= 2 for line in lines]
    runs: list[list[_Line]] = []
    current: list[_Line] = []
    for i, line in enumerate(lines):
        if current and line.top - current[-1].bottom > max_row_gap:
            runs.append(current)
            current = []
        if multi[i]:
            current.append(line)
        elif (
            current and i + 1 < len(lines) and multi[i + 1] and lines[i + 1].top - line.bottom <= max_row_gap
        ):
            current.append(line)  # a row with one filled cell, kept unless it crosses a separator
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _split_at_covering(
    run: list[_Line], min_gap: float, v_rules: Sequence[Rule]
) -> list[tuple[list[_Line], list[tuple[int, int]]]]:
    """The run with its separators; a single-segment line that covers a separator splits it, and
    each part is split again the same way, in order. Iterative (an explicit stack): a page of
    thousands of alternating lines must not reach Python's recursion limit."""
    found: list[tuple[list[_Line], list[tuple[int, int]]]] = []
    pending = [run]  # the parts still to split, the next one last
    while pending:
        part = pending.pop()
        core = [line for line in part if _segments(line, min_gap, v_rules) >= 2]
        if len(core) < MIN_ROWS:
            continue
        separators = _separators(core, min_gap, v_rules)
        for i, line in enumerate(part):
            if _segments(line, min_gap, v_rules) < 2 and _covers(line, separators):
                pending += [part[i + 1 :], part[:i]]
                break
        else:
            found.append((part, _separators(part, min_gap, v_rules)))
    return found


# --- ruling lines --------------------------------------------------------------------------------


def _long_runs(mask: pyvips.Image, length: int, horizontal: bool) -> pyvips.Image:
    """Pixels where ``length`` set pixels start, rightwards or downwards: an erosion by a line
    segment, composed of shift-and-AND steps (``E[a+b](x) = E[a](x) & E[b](x + a)``)."""
    result, reach = mask, 1
    while reach < length:
        step = min(reach, length - reach)
        if horizontal:
            shifted = result.embed(-step, 0, mask.width, mask.height)
        else:
            shifted = result.embed(0, -step, mask.width, mask.height)
        result = (result & shifted).copy_memory()
        reach += step
    return result


def _intervals(values: Sequence[float], max_hole: int = 0) -> list[tuple[int, int]]:
    """Runs of non-zero values as ``(start, end)`` (end exclusive), bridging holes up to ``max_hole``."""
    runs: list[tuple[int, int]] = []
    start = None
    last = -1
    for i, value in enumerate(values):
        if value:
            if start is None:
                start = i
            elif i - last - 1 > max_hole:
                runs.append((start, last + 1))
                start = i
            last = i
    if start is not None:
        runs.append((start, last + 1))
    return runs


def find_rules(page_image: pyvips.Image, *, min_length: int) -> list[Rule]:
    """Horizontal and vertical ruling lines of a page.

    Args:
        page_image: the page as the words' boxes measure it (any band count; the first band, or
            the grey of a colour image, is read; ink is darker than :data:`INK_THRESHOLD`).
        min_length: shortest rule, in pixels.

    Returns:
        Horizontal rules from the top, then vertical rules from the left. Rules of the same line
        interrupted by up to 2 pixels are one rule.
    """
    image = page_image
    if image.bands >= 3:
        image = image.colourspace("b-w")
    grey = image[0] if image.bands > 1 else image
    ink = (grey < INK_THRESHOLD).copy_memory()
    length = max(2, min_length)
    rules: list[Rule] = []
    for horizontal in (True, False):
        starts = _long_runs(ink, length, horizontal)
        columns, rows = starts.project()
        across = [v[0] for v in rows.tolist()] if horizontal else columns.tolist()[0]
        for a0, a1 in _intervals(across):
            band = (
                starts.crop(0, a0, starts.width, a1 - a0)
                if horizontal
                else starts.crop(a0, 0, a1 - a0, starts.height)
            )
            band_columns, band_rows = band.project()
            along = band_columns.tolist()[0] if horizontal else [v[0] for v in band_rows.tolist()]
            for b0, b1 in _intervals(along, max_hole=2):
                extent = b1 - b0 + length - 1
                if horizontal:
                    rules.append(Rule("horizontal", (b0, a0, extent, a1 - a0)))
                else:
                    rules.append(Rule("vertical", (a0, b0, a1 - a0, extent)))
    return rules


# --- tables --------------------------------------------------------------------------------------


def _is_mark(word: Word) -> bool:
    """Whether a word has no letter or digit (``-``, ``—``, ``_``, ``=``, ``*``): it takes no part
    in finding lines and columns (step 6 of the module docstring)."""
    return not any(ch.isalnum() for ch in word.text)


def _is_leader(word: Word) -> bool:
    """Whether a mark is a dot leader (``........`` from a price list's name to its price): two
    or more dots, never a cell's content, dropped wherever it lies."""
    text = word.text.strip()
    return len(text) >= 2 and all(ch in LEADER_DOTS for ch in text)


def _with_marks(
    part: Sequence[_Line], separators: Sequence[tuple[int, int]], marks: Sequence[Word]
) -> list[_Line]:
    """The part's lines with the marks that belong to them (step 6): a mark joins the line whose
    extent holds its vertical middle, when its horizontal middle lies within the part's width and
    in no separator (there it is a speck of the gutter, dropped), and it is not a dot leader
    (dropped). ``marks`` sorted by their vertical middles."""
    x0, x1 = min(line.x0 for line in part), max(line.x1 for line in part)
    lines = [_Line(list(line.words), line.top, line.bottom) for line in part]
    middles = [m.bbox[1] + m.bbox[3] / 2 for m in marks]
    first = bisect.bisect_left(middles, lines[0].top)
    last = bisect.bisect_left(middles, max(line.bottom for line in lines))
    for mark, my in zip(marks[first:last], middles[first:last], strict=True):
        mx = mark.bbox[0] + mark.bbox[2] / 2
        if not x0 <= mx < x1 or _is_leader(mark) or any(s0 <= mx < s1 for s0, s1 in separators):
            continue
        home = next((line for line in lines if line.top <= my < line.bottom), None)
        if home is not None:
            home.words.append(mark)
    for line in lines:
        line.words.sort(key=lambda w: w.bbox[0])
    return lines


def _median_height(words: Sequence[Word]) -> float:
    return statistics.median(w.bbox[3] for w in words) if words else float(DEFAULT_WORD_HEIGHT)


def _row_bands(run: Sequence[_Line], h_rules: Sequence[Rule], span: tuple[int, int]) -> list[list[_Line]]:
    """The run's lines grouped into rows: by the horizontal rules that cross at least half of the
    table's width, or one line a row."""
    x0, x1 = span
    cuts = sorted(
        r.bbox[1] + r.bbox[3] / 2
        for r in h_rules
        if min(x1, r.bbox[0] + r.bbox[2]) - max(x0, r.bbox[0]) >= 0.5 * (x1 - x0)
    )
    if len(cuts) < 2:
        return [[line] for line in run]
    rows: dict[int, list[_Line]] = {}
    for line in run:
        middle = (line.top + line.bottom) / 2
        band = sum(1 for cut in cuts if cut < middle)
        rows.setdefault(band, []).append(line)
    return [rows[key] for key in sorted(rows)]


def _alignment(cells: Sequence[Cell], tolerance: float) -> Align:
    """A column's alignment: the edge (left, right or middle) of its filled cells that varies
    least, by the mean absolute deviation from its median (a header or a total set otherwise
    moves every spread alike). Within ``tolerance`` pixels of the least, left wins over right over centre (a
    column of cells of one width is all three; it reads as left)."""
    filled = [c.bbox for c in cells if c.words]
    if not filled:
        return "left"
    edges: dict[Align, list[float]] = {
        "left": [b[0] for b in filled],
        "right": [b[0] + b[2] for b in filled],
        "centre": [b[0] + b[2] / 2 for b in filled],
    }
    spread = {}
    for how, values in edges.items():
        middle = statistics.median(values)
        spread[how] = statistics.fmean(abs(v - middle) for v in values)
    least = min(spread.values())
    return next(how for how in ("left", "right", "centre") if spread[how] <= least + tolerance)


def _is_text_column(cells: Sequence[Cell], extent: tuple[int, int]) -> bool:
    """Whether a column holds running text (:data:`MIN_TEXT_COLUMN_WORDS`,
    :data:`TEXT_COLUMN_FILL`)."""
    filled = [c for c in cells if c.words]
    if not filled or sum(len(c.words) for c in filled) / len(filled) < MIN_TEXT_COLUMN_WORDS:
        return False
    full = sum(1 for c in filled if c.bbox[2] >= TEXT_COLUMN_FILL * (extent[1] - extent[0]))
    return full >= 0.75 * len(filled)


def _line_cells(
    line: _Line, separators: Sequence[tuple[int, int]], min_gap: float
) -> list[tuple[int, int, list[Word]]]:
    """The line's cells as ``(first column, last column, words)``: its words cut at gaps of at
    least ``min_gap`` and at separators; a group of words that reaches across a separator (a
    spanning cell) belongs to the column of its first word and spans to that of its last."""

    def column_of(word: Word) -> int:
        middle = word.bbox[0] + word.bbox[2] / 2
        return sum(1 for s0, s1 in separators if middle >= (s0 + s1) / 2)

    groups: list[list[Word]] = []
    for word in line.words:
        if groups:
            left, right = groups[-1][-1].bbox[0] + groups[-1][-1].bbox[2], word.bbox[0]
            if right - left < min_gap and not any(left <= s0 and s1 <= right for s0, s1 in separators):
                groups[-1].append(word)
                continue
        groups.append([word])
    return [(column_of(g[0]), max(column_of(g[0]), column_of(g[-1])), g) for g in groups]


def _build(
    run: Sequence[_Line],
    separators: Sequence[tuple[int, int]],
    rules: Sequence[Rule],
    ruled_grid: bool,
    min_gap: float,
) -> Table | None:
    words = [w for line in run for w in line.words]
    n_cols = len(separators) + 1
    line_cells = {id(line): _line_cells(line, separators, min_gap) for line in run}

    columns: list[tuple[int, int]] = []
    by_column: dict[int, list[Word]] = {}
    spanning: dict[int, list[Word]] = {}
    for found in line_cells.values():
        for first, last, group in found:
            (by_column if first == last else spanning).setdefault(first, []).extend(group)
    for c in range(n_cols):
        in_column = by_column.get(c) or spanning.get(c, [])
        if not in_column:
            return None
        columns.append((min(w.bbox[0] for w in in_column), max(w.bbox[0] + w.bbox[2] for w in in_column)))
    span = (columns[0][0], columns[-1][1])
    h_rules = [r for r in rules if r.orientation == "horizontal"] if ruled_grid else []
    bands = _row_bands(run, h_rules, span)
    rows: list[tuple[Cell, ...]] = []
    filled = 0
    for r, band in enumerate(bands):
        top, bottom = min(line.top for line in band), max(line.bottom for line in band)
        cells = []
        for c, (c0, c1) in enumerate(columns):
            lines_text = []
            members: list[Word] = []
            reach = c
            for line in band:
                in_cell = [(last, group) for first, last, group in line_cells[id(line)] if first == c]
                if in_cell:
                    lines_text.append(" ".join(w.text for _, group in in_cell for w in group))
                    members.extend(w for _, group in in_cell for w in group)
                    reach = max(reach, *(last for last, _ in in_cell))
            bbox = _union(w.bbox for w in members) if members else (c0, top, c1 - c0, bottom - top)
            filled += bool(members)
            cells.append(Cell(r, c, "\n".join(lines_text), bbox, tuple(members), reach - c + 1))
        for c, cell in enumerate(cells):
            for covered in range(c + 1, c + cell.span):
                cells[covered] = replace(cells[covered], span=0)
        rows.append(tuple(cells))
    if len(rows) < MIN_ROWS or n_cols < MIN_COLUMNS or len(words) / max(1, filled) > MAX_MEAN_CELL_WORDS:
        return None
    single = [[row[c] for row in rows if row[c].span == 1] for c in range(n_cols)]
    if all(_is_text_column(single[c], columns[c]) for c in range(n_cols)):
        return None
    box = _union(w.bbox for w in words)
    ruled = ruled_grid
    if ruled:
        box = _union([box, *(r.bbox for r in rules)])
    tolerance = 0.1 * _median_height(words)  # a few pixels: OCR boxes of aligned text vary by 1–3
    return Table(
        bbox=box,
        rows=tuple(rows),
        columns=tuple(columns),
        ruled=ruled,
        block_ids=tuple(sorted({w.block for w in words})),
        align=tuple(_alignment(single[c], tolerance) for c in range(n_cols)),
    )


def _rules_near(rules: Sequence[Rule], lines: Sequence[_Line], margin: float) -> list[Rule]:
    """Rules that touch the box of the lines grown by ``margin``."""
    x0 = min(line.x0 for line in lines) - margin
    x1 = max(line.x1 for line in lines) + margin
    y0 = min(line.top for line in lines) - margin
    y1 = max(line.bottom for line in lines) + margin
    return [
        r
        for r in rules
        if r.bbox[0] <= x1 and r.bbox[0] + r.bbox[2] >= x0 and r.bbox[1] <= y1 and r.bbox[1] + r.bbox[3] >= y0
    ]


def detect_tables(words: Sequence[Word], page_image: pyvips.Image | None = None) -> list[Table]:
    """The tables of one page, from the top (see the module docstring for the method and sources).

    Args:
        words: the page's words (:attr:`hypermedia.engines.ocr.recognition.PageText.words`), boxes in
            pixels of the page image tesseract read.
        page_image: that image, to find ruling lines (:func:`find_rules`); ``None`` uses word
            geometry only.

    Returns:
        Tables of at least :data:`MIN_ROWS` rows and :data:`MIN_COLUMNS` columns; ``[]`` for a page
        without one. Every word belongs to at most one table.
    """
    marks = sorted(
        (w for w in words if w.text.strip() and _is_mark(w)), key=lambda w: w.bbox[1] + w.bbox[3] / 2
    )
    words = [w for w in words if not _is_mark(w)]
    if not words:
        return []
    height = _median_height(words)
    min_gap = MIN_GAP_HEIGHTS * height
    max_row_gap = MAX_ROW_GAP_HEIGHTS * height
    rules = (
        find_rules(page_image, min_length=round(MIN_RULE_HEIGHTS * height)) if page_image is not None else []
    )
    v_rules = [r for r in rules if r.orientation == "vertical"]
    lines = _group_lines(words)
    tables: list[Table] = []
    for run in _runs(lines, min_gap, max_row_gap, v_rules):
        for part, separators in _split_at_covering(run, min_gap, v_rules):
            if len(part) < MIN_ROWS or len(separators) + 1 < MIN_COLUMNS:
                continue
            near = _rules_near(rules, part, height)
            x0, x1 = min(line.x0 for line in part), max(line.x1 for line in part)
            interior_v = [
                r
                for r in near
                if r.orientation == "vertical" and x0 < r.bbox[0] and r.bbox[0] + r.bbox[2] < x1
            ]
            part = _with_marks(part, separators, marks)
            table = _build(part, separators, near, ruled_grid=bool(interior_v), min_gap=min_gap)
            if table is not None:
                tables.append(table)
    return tables


def classify_blocks(words: Sequence[Word], tables: Sequence[Table] | None = None) -> list[Block]:
    """Tesseract's blocks classified as text or table.

    A block whose words all lie outside tables is ``text``; words of a block inside a table make a
    ``table`` entry for that table (tesseract cuts a borderless table into a block per column, so
    several blocks point at one table); a block with words both inside and outside makes one
    entry of each kind, with the same ``block_id``.

    Args:
        words: the page's words.
        tables: :func:`detect_tables` of these words (computed from the words alone when ``None``).

    Returns:
        Entries ordered by block id, a text entry before the table entries of its block.
    """
    if tables is None:
        tables = detect_tables(words)
    owner: dict[int, int] = {}
    for index, table in enumerate(tables):
        for row in table.rows:
            for cell in row:
                for word in cell.words:
                    owner[id(word)] = index
    groups: dict[tuple[int, int], list[Word]] = {}
    for word in words:
        if not word.text.strip():
            continue
        index = owner.get(id(word), -1)
        if index < 0 and _is_mark(word):  # a speck of a gutter, dropped from the cells
            index = next((i for i, t in enumerate(tables) if _inside(word.bbox, t.bbox)), -1)
        groups.setdefault((word.block, index), []).append(word)
    return [
        Block(
            block_id=block_id,
            kind="text" if index < 0 else "table",
            bbox=_union(w.bbox for w in members),
            table=None if index < 0 else index,
        )
        for (block_id, index), members in sorted(groups.items())
    ]


def to_csv(table: Table) -> str:
    """The table as CSV (RFC 4180: comma-separated, fields quoted where needed, CRLF line ends),
    one record per row, one field per column; a multi-line cell's lines stay in one quoted field."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for row in table.rows:
        writer.writerow([cell.text for cell in row])
    return buffer.getvalue()


def to_json(table: Table) -> dict[str, Any]:
    """The table as JSON::

        {"bbox": [x, y, w, h], "n_rows": 6, "n_cols": 4, "ruled": false, "block_ids": [2, 3],
         "columns": [[x0, x1], …], "align": ["left", "left", "centre", "right"],
         "rows": [[{"row": 0, "col": 0, "text": "Item", "bbox": [x, y, w, h], "conf": 91.7, "span": 1},
                   …], …]}

    Boxes in pixels of the page image (as the words'), ``conf`` 0–100 or null for an empty cell.
    """
    return {
        "bbox": list(table.bbox),
        "n_rows": table.n_rows,
        "n_cols": table.n_cols,
        "ruled": table.ruled,
        "block_ids": list(table.block_ids),
        "columns": [list(c) for c in table.columns],
        "align": list(table.align),
        "rows": [
            [
                {
                    "row": cell.row,
                    "col": cell.col,
                    "text": cell.text,
                    "bbox": list(cell.bbox),
                    "conf": round(cell.conf, 2) if cell.conf is not None else None,
                    "span": cell.span,
                }
                for cell in row
            ]
            for row in table.rows
        ],
    }
