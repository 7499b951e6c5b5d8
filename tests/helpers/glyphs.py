"""Rendering script samples and checking their glyphs."""

from __future__ import annotations

import itertools
import unicodedata

import numpy as np
import pypdfium2 as pdfium
import pyvips

SCRIPTS: dict[str, tuple[str, str]] = {
    "Simplified Chinese": ("简体中文汉字测试", r"NotoS(ans|erif)CJK"),
    "Traditional Chinese": ("繁體中文漢字測試", r"NotoS(ans|erif)CJK"),
    "Japanese": ("日本語のひらがなとカタカナ", r"NotoS(ans|erif)CJK"),
    "Korean": ("한국어 한글 시험", r"NotoS(ans|erif)CJK"),
    "Arabic": ("العربية نص تجريبي", r"(Noto(Naskh|Sans|Kufi)Arabic|DejaVuSans)"),
    "Hebrew": ("עברית טקסט לדוגמה", r"(NotoS(ans|erif)Hebrew|DejaVuSans)"),
    "Devanagari": ("हिन्दी देवनागरी परीक्षण", r"NotoS(ans|erif)Devanagari"),
    "Thai": ("ภาษาไทย ทดสอบ", r"(NotoS(ans|erif)Thai|NotoLoopedThai)"),
}
"""Script → (a line of it, the base font names that may draw it: the Noto face of the script, or
DejaVu Sans, which has Arabic and Hebrew: fontconfig depends on fonts-dejavu-core). No line holds
a character whose real glyph is itself a hollow rectangle (such as 口)."""


SCALE = 4.0
"""Rendering scale of the test's own renders (288 dpi: an 11 pt character is about 44 px high)."""


GRID = 32
"""Side of the square each character's ink is resampled to before shapes are compared."""


def letter_boxes(page: pdfium.PdfPage, line: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """The letters (Unicode category L*) of ``line`` on the page, each with its glyph box in PDF
    points (PDFium's tight char box: left, bottom, right, top); letters that share one box with
    the letter before them (a Devanagari conjunct, drawn as one glyph) are left out."""
    textpage = page.get_textpage()
    text = textpage.get_text_range()
    start = text.find(line)
    assert start >= 0, f"{line!r} is not in the text layer {text!r}"
    boxes: list[tuple[str, tuple[float, float, float, float]]] = []
    for index in range(start, start + len(line)):
        char = text[index]
        box = textpage.get_charbox(index)
        if unicodedata.category(char).startswith("L") and (not boxes or boxes[-1][1] != box):
            boxes.append((char, box))
    return boxes


def shape(
    pixels: np.ndarray, box: tuple[float, float, float, float], scale: float, *, square: bool = False
) -> np.ndarray:
    """The ink (pixels darker than mid grey) of a ``GRID`` × ``GRID`` resampling of the part of
    ``pixels`` (a grey page picture, row 0 at the top, ``scale`` pixels per point) inside ``box``
    (points, PDF coordinates), trimmed to the ink's own bounding box (``square``: centred in the
    square around it first, keeping its proportions); all False when there is none."""
    left, bottom, right, top = box
    height = pixels.shape[0]
    crop = pixels[
        max(0, int(height - top * scale) - 1) : int(height - bottom * scale) + 2,
        max(0, int(left * scale) - 1) : int(right * scale) + 2,
    ]
    ink = crop < 128
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not rows.size:
        return np.zeros((GRID, GRID), bool)
    ink = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    if square:
        side = max(ink.shape)
        padded = np.zeros((side, side), bool)
        top_pad, left_pad = (side - ink.shape[0]) // 2, (side - ink.shape[1]) // 2
        padded[top_pad : top_pad + ink.shape[0], left_pad : left_pad + ink.shape[1]] = ink
        ink = padded
    y = np.arange(GRID) * ink.shape[0] // GRID
    x = np.arange(GRID) * ink.shape[1] // GRID
    return ink[np.ix_(y, x)]


def is_notdef_box(ink: np.ndarray) -> bool:
    """Whether ``ink`` (a :func:`shape`) is the .notdef box, a hollow rectangle: each edge band
    (the outer eighth of the rows or columns) inked along at least 90 % of its length, and the
    inside (all but the outer fifth on each side) empty, below 2 % ink. A glyph that is a frame
    with strokes inside it (日) has ink inside; one with an open or round side misses an edge."""
    band = GRID // 8
    edges = [
        ink[:band].any(axis=0).mean(),
        ink[-band:].any(axis=0).mean(),
        ink[:, :band].any(axis=1).mean(),
        ink[:, -band:].any(axis=1).mean(),
    ]
    inside = ink[GRID // 5 : GRID - GRID // 5, GRID // 5 : GRID - GRID // 5]
    return bool(min(edges) >= 0.9 and inside.mean() < 0.02)


def grey(image: pyvips.Image) -> np.ndarray:
    """A picture as a grey numpy array (first band, alpha flattened onto white)."""
    if image.hasalpha():
        image = image.flatten(background=255)
    return np.asarray(image.colourspace("b-w")[0].numpy())


def check_glyphs(page: pdfium.PdfPage, pixels: np.ndarray, scale: float, scripts: list[str]) -> None:
    """Every letter of each script's line in ``pixels`` (a picture of ``page`` at ``scale``) has
    ink, is not the .notdef box, and differs from every other letter of the line."""
    for script in scripts:
        line = SCRIPTS[script][0]
        letters = letter_boxes(page, line)
        assert len({char for char, _ in letters}) >= 4, (script, letters)
        for char, box in letters:
            ink = shape(pixels, box, scale)
            assert ink.mean() > 0.05, f"{script}: {char!r} draws nothing"
            assert not is_notdef_box(ink), f"{script}: {char!r} is drawn as an empty box"
        shapes = [(char, shape(pixels, box, scale, square=True)) for char, box in letters]
        for (a, ink_a), (b, ink_b) in itertools.combinations(shapes, 2):
            if a != b:
                assert (ink_a != ink_b).mean() > 0.05, f"{script}: {a!r} and {b!r} draw the same shape"


def render(page: pdfium.PdfPage) -> np.ndarray:
    """The page drawn by PDFium at ``SCALE``, grey, row 0 at the top."""
    pixels = np.asarray(page.render(scale=SCALE, grayscale=True).to_numpy())
    return pixels[..., 0] if pixels.ndim == 3 else pixels


def non_embedded_cjk_pdf() -> bytes:
    """A one-page PDF with a line in each of the four Adobe CJK character collections, each in a
    Type 0 font that is not embedded (ISO 32000-1 9.7: a CIDFontType0 without ``FontFile``, a
    predefined UCS-2 CMap), named as the Adobe CJK fonts iText and ReportLab write:
    STSong-Light (Adobe-GB1), MSung-Light (Adobe-CNS1), HeiseiMin-W3 (Adobe-Japan1),
    HYSMyeongJo-Medium (Adobe-Korea1). Returns the PDF; its lines are ``SCRIPTS``' first four."""
    fonts = [
        ("STSong-Light", "UniGB-UCS2-H", "GB1", 2, "Simplified Chinese"),
        ("MSung-Light", "UniCNS-UCS2-H", "CNS1", 0, "Traditional Chinese"),
        ("HeiseiMin-W3", "UniJIS-UCS2-H", "Japan1", 2, "Japanese"),
        ("HYSMyeongJo-Medium", "UniKS-UCS2-H", "Korea1", 1, "Korean"),
    ]
    content = "\n".join(
        f"BT /F{i} 24 Tf 40 {760 - 60 * i} Td <{SCRIPTS[script][0].encode('utf-16-be').hex()}> Tj ET"
        for i, (_, _, _, _, script) in enumerate(fonts)
    ).encode()
    resources = " ".join(f"/F{i} {5 + 2 * i} 0 R" for i in range(len(fonts)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << {resources} >> >> "
        "/Contents 4 0 R >>".encode(),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    for i, (name, cmap, ordering, supplement, _) in enumerate(fonts):
        objects.append(
            f"<< /Type /Font /Subtype /Type0 /BaseFont /{name}-{cmap} /Encoding /{cmap} "
            f"/DescendantFonts [{6 + 2 * i} 0 R] >>".encode()
        )
        objects.append(
            f"<< /Type /Font /Subtype /CIDFontType0 /BaseFont /{name} /CIDSystemInfo << /Registry (Adobe) "
            f"/Ordering ({ordering}) /Supplement {supplement} >> /FontDescriptor << /Type /FontDescriptor "
            f"/FontName /{name} /Flags 6 /FontBBox [0 -200 1000 900] /ItalicAngle 0 /Ascent 880 "
            "/Descent -120 /CapHeight 700 /StemV 80 >> /DW 1000 >>".encode()
        )
    out = b"%PDF-1.7\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out
