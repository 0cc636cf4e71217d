"""The pictures are worth looking at: every plot kind (attention heatmaps, the training loss curve,
the benchmark's sequence sweep), at several head counts, token lengths and figure widths, measured
by matplotlib itself: the size asked for, no text cut off at the figure's edge, no tick labels of
two panels on top of each other, and the panels filling most of the figure (small margins)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from bench.report import sweep_figure  # noqa: E402
from transformer_cli.plots import heatmap_figure, loss_figure  # noqa: E402

SMOLLM2_TOKENS = ["The", " cat", " sat", " on", " the", " mat", " because", " it", " was", " tired", "."]
TOY_SOURCE, TOY_TARGET = ["she", "likes", "fish", "<eos>"], ["<bos>", "elle", "aime", "poisson"]


def tick_labels(ax) -> list:
    """The tick labels ``ax`` draws: those of ticks inside its view (matplotlib keeps others, undrawn)."""
    drawn = []
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        for which in ("major", "minor"):
            locations = axis.get_majorticklocs() if which == "major" else axis.get_minorticklocs()
            labels = axis.get_majorticklabels() if which == "major" else axis.get_minorticklabels()
            slack = 1e-9 * max(abs(low), abs(high), 1.0)
            for location, label in zip(locations, labels, strict=False):
                if low - slack <= location <= high + slack and label.get_visible() and label.get_text():
                    drawn.append(label)
    return drawn


def boxes(figure):
    """The figure's drawn text artists (titles, labels, tick labels, legend entries) with their boxes (pixels)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    ticks = {id(t) for ax in figure.axes for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels(which="both")}
    texts = [t for t in figure.findobj(lambda a: hasattr(a, "get_text")) if id(t) not in ticks]
    texts = [t for t in texts if t.get_visible() and t.get_text()] + [t for ax in figure.axes for t in tick_labels(ax)]
    return [(t, t.get_window_extent(renderer)) for t in texts], renderer


def check_figure(figure, least_filled: float) -> None:
    """Nothing outside the figure; no two axes' tick labels overlap; the axes (with their labels)
    (with their labels, and the figure's own titles and legend) cover at least ``least_filled`` of the figure's area."""
    texts, renderer = boxes(figure)
    width, height = figure.bbox.width, figure.bbox.height
    for text, box in texts:
        assert box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= width + 0.5 and box.y1 <= height + 0.5, (
            f"{text.get_text()!r} is cut off: {box} in a figure {width}x{height}"
        )
    labels = [(ax, t.get_text(), t.get_window_extent(renderer)) for ax in figure.axes for t in tick_labels(ax)]
    for (ax_a, text_a, a), (ax_b, text_b, b) in itertools.combinations(labels, 2):
        if ax_a is not ax_b:
            assert not a.overlaps(b), f"{text_a!r} and {text_b!r} of two panels overlap: {a} {b}"
    # tick labels never cross another panel's image either (the narrow-figure failure)
    for ax_label, text, box in labels:
        for ax in figure.axes:
            if ax is not ax_label:
                assert not box.overlaps(ax.get_window_extent(renderer)), f"{text!r} runs into another panel"
    parts = [ax.get_tightbbox(renderer) for ax in figure.axes]
    parts += [artist.get_window_extent(renderer) for artist in [*figure.texts, *figure.legends] if artist.get_visible()]
    union = type(parts[0]).union(parts)  # the axes with their labels, the figure's titles and legends
    filled = union.width * union.height / (width * height)
    assert filled >= least_filled, f"what is drawn covers {filled:.0%} of the figure: wide empty margins"


def weights(heads: int, t_q: int, t_k: int) -> np.ndarray:
    w = np.random.default_rng(heads * 100 + t_q).random((heads, t_q, t_k))
    return w / w.sum(-1, keepdims=True)  # (H, T_q, T_k), rows sum to 1


@pytest.mark.parametrize(
    "heads,queries,keys",
    [
        (1, TOY_TARGET, TOY_SOURCE),
        (3, TOY_TARGET, TOY_SOURCE),
        (4, [f"#{i}" for i in range(7)], [f"#{i}" for i in range(11)]),
        (5, SMOLLM2_TOKENS, SMOLLM2_TOKENS),  # a grid with an empty slot
        (9, SMOLLM2_TOKENS, SMOLLM2_TOKENS),
        (
            12,
            ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"],
            ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"],
        ),
    ],
)
@pytest.mark.parametrize("width", [None, 4.0, 9.0])
def test_heatmaps_keep_every_label_inside_and_apart_with_small_margins(heads, queries, keys, width):
    title = "decoder cross-attention (target over source), layer 1 (numpy float64)"
    figure = heatmap_figure(title, weights(heads, len(queries), len(keys)), queries, keys, list(range(heads)), width)
    if width is not None:
        assert figure.get_figwidth() == pytest.approx(width)
    assert len(figure.axes) == heads + 1  # a panel per head and the colour bar
    check_figure(figure, least_filled=0.85)  # a border of ~0.1 inch around a 3-inch figure is already 12%


def test_heatmap_ticks_are_the_tokens_each_written_once_per_row_and_column():
    figure = heatmap_figure("t", weights(3, 4, 4), TOY_TARGET, TOY_SOURCE)
    first, second = figure.axes[0], figure.axes[1]
    assert [t.get_text() for t in first.get_yticklabels()] == TOY_TARGET
    assert [t.get_text() for t in first.get_xticklabels()] == TOY_SOURCE
    assert not any(t.get_text() for t in second.get_yticklabels())  # the row's queries are written once


@pytest.mark.parametrize("steps", [3, 300])
def test_loss_curve_is_legible(steps):
    losses = list(3.2 * np.exp(-np.arange(steps) / 40) + 1e-4)
    figure = loss_figure(losses, "copy in torch (float32), 300 steps")
    check_figure(figure, least_filled=0.9)
    assert figure.axes[0].get_yscale() == "log"


@pytest.mark.parametrize("steps", [3, 600])
def test_shakespeare_loss_curves_of_three_backends_are_legible(steps):
    from transformer_cli.shakespeare import curves_figure

    noise = np.random.default_rng(0).standard_normal(steps) * 0.1
    curves = {
        name: list(3.7 * np.exp(-np.arange(steps) / 150) + 4.0 + noise + 1e-3 * i)
        for i, name in enumerate(["numpy", "jax", "torch"])
    }
    figure = curves_figure(
        curves, {"numpy": 181.9, "jax": 181.9, "torch": 182.0}, "Shakespeare, 600 steps (float32, seed 0)"
    )
    check_figure(figure, least_filled=0.9)
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert legend == [
        "numpy (held-out perplexity 181.9)",
        "jax (held-out perplexity 181.9)",
        "torch (held-out perplexity 182.0)",
    ]


def test_benchmark_sweep_plot_is_legible():
    implementations = ["ours (torch)", "nn.TransformerEncoder", "ours (jax)", "Flax NNX layers", "ours (numpy)"]
    points = [
        {"seq_len": t, "ms": {name: t * (1 + i / 4) / 2 for i, name in enumerate(implementations)}}
        for t in (64, 128, 256, 512, 1024)
    ]
    figure = sweep_figure({"size": "base", "batch": 2, "points": points})
    check_figure(figure, least_filled=0.9)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == implementations
