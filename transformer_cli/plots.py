"""The pictures of ``transformer-ref``: attention heatmaps (``attention``) and the loss curve (``train --plot``).

Each function returns a matplotlib ``Figure`` (no pyplot state, no screen: the Agg canvas), which
the command saves and ``shared_tests/repository/test_plots.py`` measures: nothing clipped at the edges, no
tick labels of two panels overlapping, little empty margin, at any head count and figure width.

The heatmap grid is laid out by hand, in inches, from the measured size of its labels: every
panel of a figure shows the same tokens, so the query tokens are written once per row (left of
its first panel) and the key tokens once per column (under its lowest panel); each cell is
square; the figure's size follows from the cells and the labels (or, given a width, the cells
from it). matplotlib's own layouts leave empty bands around square images in a figure of another
shape, and let labels run into the next panel when the figure is narrow.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np

PAD = 0.08  # inches of empty border around the figure's contents
GAP = 0.12  # inches between two panels side by side
CELL = 0.3  # inches per token when no width is asked for
MIN_PANEL = 1.5  # inches: a short sentence's panels are not drawn smaller than this (no width asked for)
MIN_CELL = 0.1  # a narrower cell drops columns of panels (more rows) before it shrinks further
TICK_POINTS = 8.0  # the tokens' font size in a cell of CELL inches or more; smaller cells, smaller text
COLORBAR = 0.14  # inches: the colour bar's width


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _size(figure, text: str, points: float, rotation: float = 0) -> tuple[float, float]:
    """(width, height) in inches of ``text`` drawn at ``points``."""
    if not text:
        return 0.0, 0.0
    artist = figure.text(0, 0, text, fontsize=points, rotation=rotation)
    box = artist.get_window_extent(figure.canvas.get_renderer())
    artist.remove()
    return box.width / figure.dpi, box.height / figure.dpi


def _columns(heads: int) -> int:
    return 3 if heads % 3 == 0 and heads % 4 else min(heads, 4)  # 9 heads: 3 x 3, 12: 4 x 3


def heatmap_figure(
    title: str,
    weights: np.ndarray,
    queries: list[str],
    keys: list[str],
    head_numbers: list[int] | None = None,
    width: float | None = None,
):
    """A heatmap per head in a grid, weights in [0, 1], the tokens on the axes.

    ``weights`` (H, T_q, T_k) are the heads ``head_numbers`` (default 0 .. H - 1) of a layer;
    ``width`` (inches) fixes the figure's width (default: CELL inches per token)."""
    heads, t_q, t_k = weights.shape
    head_numbers = list(range(heads)) if head_numbers is None else head_numbers
    probe = _figure(4, 4)
    columns = _columns(heads)
    while True:  # the widest grid whose cells are at least MIN_CELL (a width too small for one column: smaller)
        cell, points, margins = max(CELL, MIN_PANEL / max(t_q, t_k)), TICK_POINTS, None
        for _ in range(3):  # the labels' size depends on the font, the font on the cell, the cell on the labels
            margins = _margins(probe, queries, keys, points)
            if width is not None:
                cell = (width - margins["left"] - margins["right"] - (columns - 1) * GAP) / (columns * t_k)
            points = max(4.0, min(TICK_POINTS, cell * 72 * 0.8))
        if width is None or cell >= MIN_CELL or columns == 1:
            break
        columns -= 1
    rows = math.ceil(heads / columns)
    row_gap = margins["panel_title"] + GAP
    figure_width = width or margins["left"] + columns * t_k * cell + (columns - 1) * GAP + margins["right"]
    title, title_points = _wrapped(probe, title, figure_width - 2 * PAD)
    margins["top"] = PAD + _size(probe, title, title_points)[1] + 0.08 + margins["panel_title"]
    height = margins["top"] + rows * t_q * cell + (rows - 1) * row_gap + margins["bottom"]
    figure = _figure(figure_width, height)

    def box(x: float, y: float, w: float, h: float) -> list[float]:  # inches from the bottom left -> fractions
        return [x / figure_width, y / height, w / figure_width, h / height]

    panel_w, panel_h = t_k * cell, t_q * cell
    grid_bottom = margins["bottom"]
    grid_top = height - margins["top"]
    image = None
    for head in range(heads):
        row, column = divmod(head, columns)
        x = margins["left"] + column * (panel_w + GAP)
        y = grid_top - panel_h - row * (panel_h + row_gap)
        ax = figure.add_axes(box(x, y, panel_w, panel_h))
        image = ax.imshow(weights[head], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_title(f"head {head_numbers[head]}", fontsize=margins["title_points"], pad=2)
        lowest = head + columns >= heads  # no panel below this one: it carries its column's key tokens
        ax.set_xticks(range(t_k), keys if lowest else [], rotation=90, fontsize=points)
        ax.set_yticks(range(t_q), queries if column == 0 else [], fontsize=points)
        ax.tick_params(length=2, pad=1)
    middle = (grid_bottom + grid_top) / 2
    figure.text(PAD / figure_width, middle / height, "query (looks)", rotation=90, va="center", ha="left",
                fontsize=margins["label_points"])  # fmt: skip
    grid_right = margins["left"] + columns * panel_w + (columns - 1) * GAP
    figure.text((margins["left"] + grid_right) / 2 / figure_width, PAD / height, "key (looked at)", ha="center",
                va="bottom", fontsize=margins["label_points"])  # fmt: skip
    figure.text(0.5, 1 - PAD / height, title, ha="center", va="top", fontsize=title_points)
    bar_height = min(grid_top - grid_bottom, max(1.0, 0.8 * (grid_top - grid_bottom)))
    bar = figure.add_axes(box(grid_right + 1.5 * GAP, middle - bar_height / 2, COLORBAR, bar_height))
    colorbar = figure.colorbar(image, cax=bar)
    colorbar.ax.tick_params(labelsize=7, length=2, pad=1)
    colorbar.set_label("attention weight", fontsize=margins["label_points"], labelpad=2)
    return figure


def _margins(probe, queries: list[str], keys: list[str], points: float) -> dict:
    """Inches left, right and below the grid of panels, from the measured labels (tick labels at ``points``)."""
    label_points, title_points = 8.0, 9.0
    tick = 2 / 72 + 1 / 72 + 0.02  # tick length, its pad, a hair
    longest_query = max((_size(probe, q, points)[0] for q in queries), default=0.0)
    longest_key = max((_size(probe, k, points, rotation=90)[1] for k in keys), default=0.0)
    label_h = _size(probe, "query (looks)", label_points)[1]
    return {
        "left": PAD + label_h + 0.06 + longest_query + tick,
        "bottom": PAD + label_h + 0.06 + longest_key + tick,
        "right": 1.5 * GAP + COLORBAR + _size(probe, "1.0", 7)[0] + 0.06 + label_h + PAD + 0.04,
        "panel_title": _size(probe, "head 0", title_points)[1] + 2 / 72 + 0.02,
        "label_points": label_points,
        "title_points": title_points,
    }


def _wrapped(probe, title: str, room: float, points: float = 11.0) -> tuple[str, float]:
    """``title`` in lines no wider than ``room`` inches (a long title over a narrow figure), and its font size."""
    shown = title
    while _size(probe, shown, points)[0] > room and points > 6:
        characters = max(10, int(len(title) * room / _size(probe, title, points)[0]))
        shown = "\n".join(textwrap.wrap(title, characters))
        if _size(probe, shown, points)[0] > room:
            points -= 1
    return shown, points


def loss_figure(losses: list[float], title: str, width: float = 6.0, height: float = 3.6):
    """The loss of every training step, on a log scale (the last steps' small losses stay visible)."""
    figure = _figure(width, height)
    ax = figure.add_subplot()
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, color="tab:blue", linewidth=1.2)
    if min(losses) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlim(1, max(2, len(losses)))
    figure.set_layout_engine("constrained", h_pad=PAD, w_pad=PAD)
    return figure
