"""Table detection (hypermedia.engines.ocr.tables) on pages rendered here with libvips' text rendering
(Pango, DejaVu Sans at 300 dpi) and read by the real tesseract: a heading paragraph above a table
of 4 columns × 6 rows whose last column is right-aligned, with and without ruling lines; a ruled
table with a cell of two lines; a page of justified prose. Invoices, a price list and prose
in columns typeset here with Pillow in DejaVu Sans, Serif, Sans Condensed and Sans Mono (8–12 pt,
300 dpi): right-aligned number columns a few digit widths before a left-aligned column, centred
columns, empty cells, rows spanning columns, dot leaders, paragraphs above and below; every cell
of every table asserted on tesseract's reading. Plus word-geometry cases built by hand.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
import pyvips
from PIL import Image, ImageDraw, ImageFont

from hypermedia.engines.ocr import tables, tesseract
from hypermedia.engines.ocr.recognition import PageText, Word
from tests.helpers.tables import (
    AMOUNTS,
    DEJAVU,
    DPI,
    INVOICE,
    INVOICE_ABOVE,
    INVOICE_ALIGN,
    INVOICE_BELOW,
    ROWS,
    Align,
    _text,
    expected_invoice_cells,
    render_invoice,
    render_invoice_page,
    render_table_page,
)

PROSE = [
    "Optical character recognition turns the image of a page into text. The engine finds the "
    "lines of the page, cuts them into words and recognises every word with a neural network "
    "trained on many fonts, then returns the words with their positions and confidences.",
    "Layout analysis comes first: the page is divided into blocks of text, pictures and rules, "
    "and the blocks are put in reading order. Columns of a newspaper are read one after another, "
    "and a caption stays beside its picture rather than running into the body of the article.",
    "Tables are harder, because their cells are short and separated only by white space; the "
    "columns must be found from the gaps that run down through several consecutive lines.",
]


needs_tesseract = pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed")


def render_prose_page(path: Path) -> Path:
    canvas = pyvips.Image.black(2400, 1500)
    y = 120
    for paragraph in PROSE:
        text = _text(paragraph, width=2000, justify=True)
        canvas = canvas.insert(text, 150, y)
        y += text.height + 60
    (255 - canvas).cast("uchar").copy(xres=DPI / 25.4, yres=DPI / 25.4).pngsave(str(path))
    return path


def recognise(path: Path) -> PageText:
    """The lowest-level OCR call that returns words: one tesseract run (``--psm 3``)."""
    return tesseract.Tesseract(timeout_seconds=60).recognise(path, languages=["eng"], dpi=DPI)


def page_image(path: Path) -> pyvips.Image:
    return pyvips.Image.new_from_file(str(path)).copy_memory()


@pytest.fixture(scope="module")
def borderless(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PageText]:
    path = render_table_page(tmp_path_factory.mktemp("tables") / "borderless.png")
    return path, recognise(path)


@pytest.fixture(scope="module")
def ruled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PageText]:
    path = render_table_page(tmp_path_factory.mktemp("tables") / "ruled.png", ruled=True)
    return path, recognise(path)


def assert_supplies_table(table: tables.Table) -> None:
    assert (table.n_rows, table.n_cols) == (6, 4)
    assert [row[3].text for row in table.rows] == AMOUNTS
    assert [cell.text for cell in table.rows[0]] == list(ROWS[0])
    assert [row[0].text for row in table.rows] == [row[0] for row in ROWS]
    assert table.rows[2][2].text == "2024-01-12"
    for r, row in enumerate(table.rows):
        assert [(cell.row, cell.col) for cell in row] == [(r, c) for c in range(4)]
    # The right-aligned column: its cells end at one x, and start at different ones.
    ends = {cell.bbox[0] + cell.bbox[2] for cell in (row[3] for row in table.rows)}
    starts = {row[3].bbox[0] for row in table.rows}
    assert max(ends) - min(ends) <= 3 < max(starts) - min(starts)


def assert_heading_is_text(words: Sequence[Word], found: list[tables.Table]) -> None:
    blocks = tables.classify_blocks(words, found)
    table_top = found[0].bbox[1]
    heading_blocks = {w.block for w in words if w.bbox[1] < table_top}
    assert heading_blocks
    for block in blocks:
        if block.block_id in heading_blocks:
            assert block.kind == "text", block
    table_words = {id(w) for row in found[0].rows for cell in row for w in cell.words}
    assert any(b.kind == "table" for b in blocks)
    assert all(b.table == 0 for b in blocks if b.kind == "table")
    # Every word below the heading is in the table.
    assert len(table_words) == sum(1 for w in words if w.bbox[1] >= table_top)


@needs_tesseract
def test_borderless_table_with_right_aligned_column(borderless: tuple[Path, PageText]) -> None:
    _, result = borderless
    found = tables.detect_tables(result.words)
    assert len(found) == 1
    assert_supplies_table(found[0])
    assert not found[0].ruled
    assert_heading_is_text(result.words, found)


@needs_tesseract
def test_borderless_table_with_page_image(borderless: tuple[Path, PageText]) -> None:
    path, result = borderless
    found = tables.detect_tables(result.words, page_image(path))
    assert len(found) == 1
    assert_supplies_table(found[0])
    assert not found[0].ruled


@needs_tesseract
def test_ruled_table(ruled: tuple[Path, PageText]) -> None:
    path, result = ruled
    found = tables.detect_tables(result.words, page_image(path))
    assert len(found) == 1
    assert_supplies_table(found[0])
    assert found[0].ruled
    assert_heading_is_text(result.words, found)
    # The grid's frame is part of the table's box.
    x, _, width, _ = found[0].bbox
    assert (x, x + width) == (120, 2183)


@needs_tesseract
def test_ruled_table_from_words_alone(ruled: tuple[Path, PageText]) -> None:
    _, result = ruled
    found = tables.detect_tables(result.words)
    assert len(found) == 1
    assert_supplies_table(found[0])


def test_find_rules_on_a_drawn_grid() -> None:
    page = pyvips.Image.black(600, 400).invert().cast("uchar")
    page = page.draw_rect(0, 50, 100, 500, 2, fill=True)  # horizontal, 500 long
    page = page.draw_rect(0, 300, 20, 4, 300, fill=True)  # vertical, 300 long
    page = page.draw_rect(0, 50, 350, 60, 2, fill=True)  # too short
    rules = tables.find_rules(page, min_length=100)
    assert rules == [
        tables.Rule("horizontal", (50, 100, 500, 2)),
        tables.Rule("vertical", (300, 20, 4, 300)),
    ]


@needs_tesseract
def test_ruled_grid_keeps_a_cell_of_two_lines_in_one_row(tmp_path: Path) -> None:
    rows = [list(row) for row in ROWS]
    rows[4][0] = "Printer toner\ncartridge"
    path = render_table_page(tmp_path / "wrapped.png", rows=rows, ruled=True, row_height=130)
    result = recognise(path)
    found = tables.detect_tables(result.words, page_image(path))
    assert len(found) == 1
    table = found[0]
    assert (table.n_rows, table.n_cols) == (6, 4)
    assert table.rows[4][0].text == "Printer toner\ncartridge"
    assert [row[3].text for row in table.rows] == AMOUNTS


@needs_tesseract
def test_centred_column_and_empty_cell(tmp_path: Path) -> None:
    rows = [list(row) for row in ROWS]
    rows[3][1] = ""
    path = render_table_page(tmp_path / "centred.png", rows=rows, align=("left", "centre", "left", "right"))
    found = tables.detect_tables(recognise(path).words)
    assert len(found) == 1
    table = found[0]
    assert (table.n_rows, table.n_cols) == (6, 4)
    assert [row[1].text for row in table.rows] == [row[1] for row in rows]
    assert table.rows[3][1].words == ()
    assert table.rows[3][1].conf is None


@needs_tesseract
def test_prose_page_has_no_table(tmp_path: Path) -> None:
    result = recognise(render_prose_page(tmp_path / "prose.png"))
    assert len(result.words) > 100
    assert tables.detect_tables(result.words) == []
    assert {block.kind for block in tables.classify_blocks(result.words)} == {"text"}


@needs_tesseract
def test_csv_and_json(borderless: tuple[Path, PageText]) -> None:
    _, result = borderless
    table = tables.detect_tables(result.words)[0]
    records = list(csv.reader(io.StringIO(tables.to_csv(table), newline="")))
    assert [len(record) for record in records] == [4] * 6
    assert records == [list(row) for row in ROWS]
    document = tables.to_json(table)
    assert (document["n_rows"], document["n_cols"]) == (6, 4)
    assert [row[3]["text"] for row in document["rows"]] == AMOUNTS
    assert all(len(cell["bbox"]) == 4 and 0 < cell["conf"] <= 100 for row in document["rows"] for cell in row)


def _word(text: str, x: int, y: int, w: int, block: int = 1) -> Word:
    return Word(text, (x, y, w, 30), 95.0, block, 1, 1, 1)


def test_two_columns_are_not_a_table() -> None:
    words = [
        word
        for r in range(5)
        for word in (_word(f"name{r}", 100, 100 + 60 * r, 120), _word("x", 600, 100 + 60 * r, 20))
    ]
    assert tables.detect_tables(words) == []


def test_csv_quotes_commas_and_line_breaks() -> None:
    cells = [("a,b", 'say "hi"', "two\nlines"), ("1", "2", "3")]
    table = tables.Table(
        bbox=(0, 0, 10, 10),
        rows=tuple(
            tuple(tables.Cell(r, c, text, (0, 0, 1, 1)) for c, text in enumerate(row))
            for r, row in enumerate(cells)
        ),
        columns=((0, 1), (2, 3), (4, 5)),
    )
    assert list(csv.reader(io.StringIO(tables.to_csv(table), newline=""))) == [list(row) for row in cells]


def test_the_ocr_operation_returns_the_table_as_json_and_csv(tmp_path: Path) -> None:
    """Through the sandbox entry (``hypermedia.engines.ocr.engine.run``) with ``table_detection``: a
    ``tables`` JSON output with the one 6 × 4 table, and a CSV output of it."""
    from tests.helpers.ocr import ocr

    source = render_table_page(tmp_path / "table.png")
    result = ocr(source, tmp_path, table_detection=True)
    kinds = result.outputs
    assert {"text", "words", "tables", "table_p1_1"} <= set(kinds)
    document = json.loads(result.path("tables").read_text())
    [page] = document["pages"]
    [table] = page["tables"]
    assert (table["n_rows"], table["n_cols"]) == (6, 4)
    assert kinds["tables"].metadata["table_count"] == 1
    rows = list(csv.reader(io.StringIO(result.path("table_p1_1").read_text(), newline="")))
    assert [len(row) for row in rows] == [4] * 6
    assert [row[3] for row in rows] == AMOUNTS


def test_thousands_of_alternating_lines_do_not_reach_the_recursion_limit() -> None:
    """Rows of three cells alternating with lines that cover the gaps between them: each covering
    line splits the run again (the hostile review's probe; it once raised RecursionError)."""
    words = []
    for i in range(2100):
        y = i * 14
        if i % 2 == 0:
            cells = (("aa", 0), ("bb", 100), ("cc", 200))
            words += [Word(t, (x, y, 20, 10), 90.0, 1, 1, i, n) for n, (t, x) in enumerate(cells, 1)]
        else:
            words.append(Word("x" * 20, (0, y, 220, 10), 90.0, 1, 1, i, 1))
    assert tables.detect_tables(words) == []


def test_csv_outputs_stop_at_the_cap_and_the_json_keeps_every_table(tmp_path: Path) -> None:
    from hypermedia.engines.ocr.outputs import MAX_TABLE_OUTPUTS, _table_outputs

    table = {"n_rows": 1, "n_cols": 2, "csv": "a,b\r\n"}
    records = [{"page": page, "tables": [table] * 30} for page in (1, 2, 3)]  # 90 tables
    outputs = list(_table_outputs(tmp_path, {"page_count": 3}, records))
    assert (
        outputs[0].metadata["table_count"] == 90 and outputs[0].metadata["csv_outputs"] == MAX_TABLE_OUTPUTS
    )
    csvs = outputs[1:]
    assert len(csvs) == MAX_TABLE_OUTPUTS == 50
    assert [o.output_type for o in csvs[29:31]] == ["table_p1_30", "table_p2_1"]
    document = json.loads((tmp_path / "tables.json").read_text())
    assert sum(len(page["tables"]) for page in document["pages"]) == 90
    assert "page_count" not in csvs[0].metadata and csvs[0].metadata["rows"] == 1


# --- invoices and price lists: mixed alignments, narrow gutters (issue 15, item 12) -------------


def cells(table: tables.Table) -> list[list[str]]:
    return [[cell.text for cell in row] for row in table.rows]


def assert_paragraphs_are_text(words: Sequence[Word], table: tables.Table) -> None:
    """Every word above and below the table is outside it, in a ``text`` block entry."""
    top, bottom = table.bbox[1], table.bbox[1] + table.bbox[3]
    inside = {id(w) for row in table.rows for cell in row for w in cell.words}
    outside = [w for w in words if w.text.strip() and not top <= w.bbox[1] + w.bbox[3] / 2 < bottom]
    assert " ".join(w.text for w in outside) == " ".join(INVOICE_ABOVE + INVOICE_BELOW)
    assert not inside & {id(w) for w in outside}
    kinds = {(b.block_id, b.kind) for b in tables.classify_blocks(words, [table])}
    assert {(w.block, "text") for w in outside} <= kinds


def render_prose_columns(path: Path, *, columns: int, width: int, gutter: int, points: float = 10) -> Path:
    """An A4 page at 300 dpi typeset with Pillow in DejaVu Sans: :data:`PROSE` set ragged right
    (left-aligned, lines broken greedily at ``width`` pixels) in ``columns`` columns ``gutter``
    pixels apart, the text running on from the foot of one column to the head of the next."""
    px = round(points * DPI / 72)
    face = ImageFont.truetype(str(DEJAVU / "DejaVuSans.ttf"), px)
    lines: list[str] = []
    for paragraph in PROSE:
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}".strip()
            if line and face.getlength(candidate) > width:
                lines.append(line)
                candidate = word
            line = candidate
        lines += [line, ""]
    per_column = -(-len(lines) // columns)
    page = Image.new("L", (2480, 3508), 255)
    draw = ImageDraw.Draw(page)
    for i, line in enumerate(lines):
        column, row = divmod(i, per_column)
        draw.text((150 + column * (width + gutter), 150 + row * round(px * 1.5)), line, font=face, fill=0)
    page.save(path, dpi=(DPI, DPI))
    return path


@needs_tesseract
@pytest.mark.parametrize(
    ("font", "points", "gutter"),
    [
        ("DejaVuSans.ttf", 10, 2),
        ("DejaVuSerif.ttf", 12, 2),
        ("DejaVuSerif.ttf", 9, 4),
        ("DejaVuSansCondensed.ttf", 9, 3),
        ("DejaVuSansCondensed.ttf", 11, 3),
        ("DejaVuSansCondensed.ttf", 12, 2),
        ("DejaVuSansMono.ttf", 11, 4),
    ],
)
def test_invoice_with_narrow_gutters(tmp_path: Path, font: str, points: float, gutter: float) -> None:
    """A right-aligned price column whose numbers end ``gutter`` digit widths before the
    left-aligned unit column starts, every other gutter as narrow: tesseract reads a speck
    (``_``, ``—-``, ``=``) out of a blank gutter of the header row in most of these, which once
    bridged the gutter and merged two columns (5 columns came back as 4)."""
    result = recognise(render_invoice_page(tmp_path / "invoice.png", font=font, points=points, gutter=gutter))
    found = tables.detect_tables(result.words)
    assert len(found) == 1
    [table] = found
    assert cells(table) == [list(row) for row in INVOICE]
    assert table.align == INVOICE_ALIGN
    assert_paragraphs_are_text(result.words, table)


@needs_tesseract
def test_invoice_with_a_centred_column_and_an_empty_cell(tmp_path: Path) -> None:
    """A centred quantity column between a left-aligned description and a right-aligned price,
    and a unit cell left empty."""
    rows = [
        [r[0], r[1], q, *r[2:]] for r, q in zip(INVOICE, ["Qty", "2", "1", "100", "10", "2"], strict=True)
    ]
    rows[3][4] = ""
    align: tuple[Align, ...] = ("left", "left", "centre", "right", "left", "right")
    path = render_invoice_page(
        tmp_path / "centred.png", font="DejaVuSerif.ttf", points=9, rows=rows, align=align
    )
    result = recognise(path)
    [table] = tables.detect_tables(result.words)
    assert cells(table) == rows
    assert table.align == align
    assert table.rows[3][4].words == () and table.rows[3][4].conf is None
    assert_paragraphs_are_text(result.words, table)


@needs_tesseract
@pytest.mark.parametrize(
    ("columns", "width", "gutter", "points"),
    [(1, 1400, 0, 10), (2, 1000, 60, 10), (3, 650, 50, 10), (3, 500, 45, 9), (4, 450, 40, 8)],
)
def test_ragged_prose_in_columns_is_not_a_table(
    tmp_path: Path, columns: int, width: int, gutter: int, points: float
) -> None:
    """Prose set ragged right in one to four columns: no table (three and four narrow columns,
    5–6 words a line, once came back as a table of 10 × 3 and 8 × 4)."""
    path = render_prose_columns(
        tmp_path / "prose.png", columns=columns, width=width, gutter=gutter, points=points
    )
    result = recognise(path)
    assert len(result.words) > 100
    assert tables.detect_tables(result.words) == []
    assert {block.kind for block in tables.classify_blocks(result.words)} == {"text"}


def test_a_mark_in_a_gutter_is_dropped_and_one_in_a_column_kept() -> None:
    """Words of no letter or digit take no part in finding the columns: a ``_`` in the gutter
    between two columns of the header row is a speck, dropped (its block is the table's, not
    text); a ``-`` where a cell stands is that cell's text."""
    words = []
    for r in range(4):
        y = 100 + 60 * r
        words += [_word(f"name{r}", 100, y, 120), _word(f"{r}.50", 400, y, 80), _word(f"unit{r}", 520, y, 90)]
    words[5] = _word("-", 520, 160, 20)  # row 1's unit
    words.append(_word("_", 490, 100, 25, block=2))  # in the 40-pixel gutter of row 0
    [table] = tables.detect_tables(words)
    assert cells(table) == [
        ["name0", "0.50", "unit0"],
        ["name1", "1.50", "-"],
        ["name2", "2.50", "unit2"],
        ["name3", "3.50", "unit3"],
    ]
    assert table.align == ("left", "left", "left")
    assert [(b.block_id, b.kind) for b in tables.classify_blocks(words, [table])] == [
        (1, "table"),
        (2, "table"),
    ]


@needs_tesseract
def test_invoice_with_rows_spanning_columns(tmp_path: Path) -> None:
    """Two rows below the items whose labels reach into the gutter after the code column (a
    delivery note across it and on into the next gutter, the total into it): they keep the
    table's columns (a label over a gutter once removed it from every row: code, description and
    price came back as one column); the note is one cell spanning code and description (the cell
    it covers empty, span 0), the total's label one cell of the code column."""
    totals = [("Delivery by road freight, insured", "25.00"), ("Total due", "1,449.20")]
    path = render_invoice_page(tmp_path / "totals.png", gutter=3, totals=totals)
    result = recognise(path)
    [table] = tables.detect_tables(result.words)
    assert cells(table) == [list(row) for row in INVOICE] + [
        [label, "", "", "", amount] for label, amount in totals
    ]
    assert table.align == INVOICE_ALIGN
    assert [[cell.span for cell in row] for row in table.rows[-2:]] == [[2, 0, 1, 1, 1], [1] * 5]
    assert all(cell.span == 1 for row in table.rows[:-2] for cell in row)
    assert [cell["span"] for cell in tables.to_json(table)["rows"][-2]] == [2, 0, 1, 1, 1]
    assert_paragraphs_are_text(result.words, table)


def test_the_ocr_operation_finds_the_invoice(tmp_path: Path) -> None:
    """Through the sandbox entry (preprocessing included): the invoice as one 8 × 5 table in
    ``tables.json`` with its alignments and spans, and as CSV."""
    from tests.helpers.ocr import ocr

    result = ocr(render_invoice(tmp_path / "invoice.png"), tmp_path, table_detection=True, escalate=False)
    [page] = json.loads(result.path("tables").read_text())["pages"]
    [table] = page["tables"]
    assert [[cell["text"] for cell in row] for row in table["rows"]] == expected_invoice_cells()
    assert table["align"] == list(INVOICE_ALIGN)
    assert [cell["span"] for cell in table["rows"][6]] == [2, 0, 1, 1, 1]
    rows = list(csv.reader(io.StringIO(result.path("table_p1_1").read_text(), newline="")))
    assert rows == expected_invoice_cells()
    assert {b["kind"] for b in page["blocks"]} == {"text", "table"}


PRICE_LIST = [
    ("Espresso", "2.50", "cup", "hot"),
    ("Cappuccino", "3.20", "cup", "hot"),
    ("Iced tea, lemon", "12.00", "jug", "cold"),
    ("Water", "0.90", "glass", "cold"),
    ("Hot chocolate", "3.80", "mug", "hot"),
]


def render_price_list(path: Path, font: str) -> Path:
    """A price list typeset with Pillow at 10 pt, 300 dpi: each item followed by a dot leader
    (``. . .``) up to a digit's width before its price, prices set right, the unit two digits
    after the prices' right edge, the serving three digits after the widest unit."""
    px = round(10 * DPI / 72)
    face = ImageFont.truetype(str(DEJAVU / font), px)
    page = Image.new("L", (2480, 1800), 255)
    draw = ImageDraw.Draw(page)
    digit = face.getlength("0")
    price_right = 150 + max(face.getlength(r[0]) for r in PRICE_LIST) + 4 * digit + face.getlength("12.00")
    unit_left = price_right + 2 * digit
    serving_left = unit_left + max(face.getlength(r[2]) for r in PRICE_LIST) + 3 * digit
    for i, (item, price, unit, serving) in enumerate(PRICE_LIST):
        y = 200 + i * round(px * 1.6)
        draw.text((150, y), item, font=face, fill=0)
        start, end = 150 + face.getlength(item) + digit, price_right - face.getlength(price) - digit
        dots = ". " * int((end - start) // face.getlength(". "))
        draw.text((start, y), dots.strip(), font=face, fill=0)
        draw.text((price_right - face.getlength(price), y), price, font=face, fill=0)
        draw.text((unit_left, y), unit, font=face, fill=0)
        draw.text((serving_left, y), serving, font=face, fill=0)
    page.save(path, dpi=(DPI, DPI))
    return path


@needs_tesseract
@pytest.mark.parametrize("font", ["DejaVuSans.ttf", "DejaVuSerif.ttf"])
def test_price_list_with_dot_leaders(tmp_path: Path, font: str) -> None:
    """Dot leaders run from each item across the gutter to its price (tesseract reads each as one
    word of dots): they are not cells, and do not bridge the gutter."""
    result = recognise(render_price_list(tmp_path / "prices.png", font))
    assert any(set(w.text) == {"."} for w in result.words)
    [table] = tables.detect_tables(result.words)
    assert cells(table) == [list(row) for row in PRICE_LIST]
    assert table.align == ("left", "right", "left", "left")
    assert {b.kind for b in tables.classify_blocks(result.words, [table])} == {"table"}
