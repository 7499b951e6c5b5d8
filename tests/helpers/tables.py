"""Rendered table pages for OCR."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pyvips
from PIL import Image, ImageDraw, ImageFont

DPI = 300
FONT = "DejaVu Sans 10"
HEADING = (
    "Quarterly office supplies. The table below lists the items ordered by the branch office "
    "during the first quarter, with their category, the date of the order and the amount paid."
)


ROWS = [
    ("Item", "Category", "Date", "Amount"),
    ("Blue pens", "Stationery", "2024-01-05", "12.50"),
    ("Paper A4 ream", "Paper", "2024-01-12", "1,234.00"),
    ("Stapler", "Hardware", "2024-02-03", "7.25"),
    ("Printer toner", "Consumables", "2024-02-20", "310.40"),
    ("Desk lamp", "Furniture", "2024-03-14", "99.99"),
]


AMOUNTS = [row[3] for row in ROWS]
COLUMNS = [(150, 700), (800, 1250), (1350, 1750), (1850, 2150)]
"""Each column's box ``(x0, x1)`` in pixels; text is placed in it by the column's alignment."""


Align = Literal["left", "centre", "right"]


def _text(markup: str, width: int | None = None, justify: bool = False) -> pyvips.Image:
    if width is None:
        return pyvips.Image.text(markup, font=FONT, dpi=DPI)
    return pyvips.Image.text(markup, font=FONT, dpi=DPI, width=width, justify=justify)


def render_table_page(
    path: Path,
    *,
    rows: Sequence[Sequence[str]] = ROWS,
    align: Sequence[Align] = ("left", "left", "left", "right"),
    ruled: bool = False,
    row_height: int = 90,
) -> Path:
    """A 2400 × 1500 page (300 dpi): the heading paragraph, then the table; ``\\n`` in a cell
    breaks it into lines; ``ruled`` draws a full grid of 3-pixel rules."""
    canvas = pyvips.Image.black(2400, 1500)
    heading = _text(HEADING, width=2000)
    canvas = canvas.insert(heading, 150, 120)
    top = 120 + heading.height + 120
    for r, row in enumerate(rows):
        for (x0, x1), how, cell in zip(COLUMNS, align, row, strict=True):
            if not cell:
                continue
            glyphs = _text(cell)
            x = {"left": x0, "right": x1 - glyphs.width, "centre": (x0 + x1 - glyphs.width) // 2}[how]
            canvas = canvas.insert(glyphs, x, top + r * row_height)
    page = (255 - canvas).cast("uchar")
    if ruled:
        y0, y1 = top - 25, top - 25 + len(rows) * row_height
        for r in range(len(rows) + 1):
            page = page.draw_rect(0, 120, y0 + r * row_height, 2060, 3, fill=True)
        for x in (120, 770, 1320, 1800, 2180):
            page = page.draw_rect(0, x, y0, 3, y1 - y0 + 3, fill=True)
    page.copy(xres=DPI / 25.4, yres=DPI / 25.4).pngsave(str(path))
    return path


DEJAVU = Path("/usr/share/fonts/truetype/dejavu")
INVOICE_ABOVE = (
    "Invoice 2024-117. Thank you for your order; the items below were shipped",
    "on 3 May by road freight and are payable within thirty days of delivery.",
)


INVOICE_BELOW = (
    "Goods remain our property until paid in full. Questions about this",
    "invoice go to accounts at the address printed overleaf, please.",
)


INVOICE = [
    ("Code", "Description", "Price", "Unit", "Total"),
    ("A-100", "Blue widget, large", "9.50", "each", "19.00"),
    ("B-220", "Red gasket", "1,234.00", "box", "1,234.00"),
    ("C-7", "Steel bolt M8", "0.35", "each", "35.00"),
    ("D-15", "Copper wire 2 mm", "12.80", "metre", "128.00"),
    ("E-3", "Glue", "4.10", "tube", "8.20"),
]


INVOICE_ALIGN: tuple[Align, ...] = ("left", "left", "right", "left", "right")


def render_invoice_page(
    path: Path,
    *,
    font: str = "DejaVuSans.ttf",
    points: float = 10,
    gutter: float = 3,
    rows: Sequence[Sequence[str]] = INVOICE,
    align: Sequence[Align] = INVOICE_ALIGN,
    paragraphs: bool = True,
    totals: Sequence[tuple[str, str]] = (),
) -> Path:
    """An A4 page at 300 dpi typeset with Pillow in a DejaVu font: two lines of text, the table,
    two lines of text. Each column is as wide as its widest cell, and every gutter is ``gutter``
    widths of the font's digit ``0`` (2 is a right-aligned number ending two digits before the
    next column's text starts); cells are placed in their column by ``align``. Each of
    ``totals``, ``(label, amount)``, adds a row below: the label from the first column's left
    edge on (reaching into the next columns), the amount set right in the last column."""
    px = round(points * DPI / 72)
    face = ImageFont.truetype(str(DEJAVU / font), px)
    page = Image.new("L", (2480, 3508), 255)
    draw = ImageDraw.Draw(page)
    digit = face.getlength("0")
    widths = [max(face.getlength(row[c]) for row in rows) for c in range(len(rows[0]))]
    lefts = [150 + sum(widths[:c]) + c * gutter * digit for c in range(len(widths))]
    y = 150
    if paragraphs:
        for line in INVOICE_ABOVE:
            draw.text((150, y), line, font=face, fill=0)
            y += round(px * 1.5)
        y += 2 * px
    for row in rows:
        for left, width, how, cell in zip(lefts, widths, align, row, strict=True):
            length = face.getlength(cell)
            x = {"left": left, "right": left + width - length, "centre": left + (width - length) / 2}[how]
            draw.text((x, y), cell, font=face, fill=0)
        y += round(px * 1.6)
    for label, amount in totals:
        draw.text((lefts[0], y), label, font=face, fill=0)
        draw.text((lefts[-1] + widths[-1] - face.getlength(amount), y), amount, font=face, fill=0)
        y += round(px * 1.6)
    if paragraphs:
        y += 2 * px
        for line in INVOICE_BELOW:
            draw.text((150, y), line, font=face, fill=0)
            y += round(px * 1.5)
    page.save(path, dpi=(DPI, DPI))
    return path


INVOICE_TOTALS = [("Delivery by road freight, insured", "25.00"), ("Total due", "1,449.20")]


def render_invoice(path: Path) -> Path:
    """The invoice page of the operation's and the REST test: DejaVu Sans 10 pt, gutters of two
    digits, the delivery and total rows below the items."""
    return render_invoice_page(path, gutter=2, totals=INVOICE_TOTALS)


def expected_invoice_cells() -> list[list[str]]:
    """The cells of :func:`render_invoice`'s table, row by row: the items, then the totals."""
    return [list(row) for row in INVOICE] + [[label, "", "", "", amount] for label, amount in INVOICE_TOTALS]
