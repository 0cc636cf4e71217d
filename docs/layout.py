"""Does every page read well at 1000, 1400 and 1900 px wide? Measured in headless Chromium.

``measure(site)`` loads every page of a built site at each width in one Chromium run: a
harness page holds one iframe per page and width (an iframe's width is its page's window
width), and ``docs/layout.js`` measures each page once everything has loaded. ``problems``
turns the measurements into sentences: an equation wider than its box (clipped, or merely
scrolled: both fail), content cut off by a box that hides its overflow, a page that runs
past the right edge of the window, code wider than its column, and, from
``THREE_COLUMNS_FROM`` px up, a three-column section whose columns are not side by side, or
a source line in one that wraps though it is no longer than its column holds (``CODE_FITS``).
Used by ``shared_tests/repository/test_docs.py`` (skipped without Chromium).
"""

from __future__ import annotations

import html
import json
import pathlib
import re

from . import chromium

WIDTHS = (1000, 1400, 1900)
THREE_COLUMNS_FROM = 1400  # narrower, a stacked or scrolled layout would do, if nothing is cut off
# Characters of a source line, its indentation included, that a column of a three-column section
# holds without wrapping (docs/site.css: 11px DejaVu Sans Mono, the smallest code font that reads
# well, from 1400 px; larger from 2200 px), with a character to spare for the rendering's rounding.
# A shorter line that wraps is a problem at that width and wider. A 100-character line (the
# backends' limit) needs 2200 px: three columns of 100 characters and line numbers at 11px do not
# fit in 1400 px (they would need a 7px font).
CODE_FITS = {1400: 63, 1900: 88, 2200: 100}
HARNESS = "_layout.html"  # written into the site while measuring, removed after
FRAME_HEIGHT = 900
SCRIPT = pathlib.Path(__file__).resolve().parent / "layout.js"


def measure(site: pathlib.Path, widths: tuple[int, ...] = WIDTHS) -> dict[tuple[str, int], dict]:
    """(page file name, width) -> ``{"problems": [...], "columns": [[head, head, head], ...], "wrapped":
    [line, ...]}``: a wrapped line of a three-column section is ``{"backend", "line" (its number in
    the file), "chars", "text" (its first 40 characters), "rows"}``."""
    pages = sorted(p.name for p in site.glob("*.html") if p.name != HARNESS)
    frames = "\n".join(
        f'<iframe data-page="{page}" data-width="{width}" src="{page}" '
        f'style="display:block;border:0;width:{width}px;height:{FRAME_HEIGHT}px"></iframe>'
        for width in widths
        for page in pages
    )
    harness = site / HARNESS
    harness.write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>layout</title></head><body>\n'
        f'<pre id="layout-results">pending</pre>\n{frames}\n'
        f"<script>\n{SCRIPT.read_text(encoding='utf-8')}\n</script>\n</body></html>\n",
        encoding="utf-8",
    )
    try:
        dom = chromium.dump_dom(harness, (max(widths) + 40, 1000))
    finally:
        harness.unlink()
    found = re.search(r'<pre id="layout-results">(.*?)</pre>', dom, re.S)
    text = html.unescape(found.group(1)) if found else "pending"
    if text == "pending":
        raise RuntimeError("the layout script did not run in Chromium (docs/layout.js)")
    measured = {}
    for key, result in json.loads(text).items():
        page, width = key.rsplit(" ", 1)
        measured[(page, int(width))] = result
    return measured


def side_by_side(heads: list[dict], width: int) -> bool:
    """Three column heads in one row, left to right, each at least a quarter of the window wide."""
    if len(heads) != 3 or len({round(h["top"]) for h in heads}) != 1:
        return False
    inside = all(0 <= h["left"] and h["right"] <= width for h in heads)
    ordered = all(a["right"] <= b["left"] for a, b in zip(heads, heads[1:], strict=False))
    return inside and ordered and all(h["right"] - h["left"] >= width / 4 for h in heads)


def code_fits(width: int) -> int:
    """How many characters a source line may have and still not wrap in a column at ``width`` px (0:
    below THREE_COLUMNS_FROM, where the columns may be too narrow for any promise)."""
    return max([chars for at, chars in CODE_FITS.items() if at <= width], default=0)


def wrapped(page: str, width: int, line: dict) -> str:
    """``"attention.html at 1400 px: numpy line 42 wraps (70 characters): 'def f(...'"``."""
    return (
        f"{page} at {width} px: {line['backend']} line {line['line']} wraps "
        f"({line['chars']} characters): {line['text']!r}"
    )


def problems(measured: dict[tuple[str, int], dict]) -> list[str]:
    """What ``measure`` found, one sentence each: ``"attention.html at 1400 px: ..."``."""
    found = []
    for (page, width), result in sorted(measured.items()):
        found += [f"{page} at {width} px: {problem}" for problem in result["problems"]]
        if width >= THREE_COLUMNS_FROM:
            for heads in result["columns"]:
                if not side_by_side(heads, width):
                    where = ", ".join(
                        f"{h['backend']} x {h['left']:.0f}..{h['right']:.0f} y {h['top']:.0f}" for h in heads
                    )
                    found.append(f"{page} at {width} px: the three columns are not side by side ({where})")
        fits = code_fits(width)
        found += [
            f"{wrapped(page, width, line)}, and a column holds {fits}"
            for line in result.get("wrapped", [])
            if line["chars"] <= fits
        ]
    return found
