"""The training loop, written once for every backend (as ``decoding`` is the search).

A backend's ``train`` hands in what is its own: its optimizer (already built on the model),
its ``train_step(model, optimizer, batch, label_smoothing) -> loss`` (forward, loss,
gradients, update) and its ``seed_dropout``. Everything else (the order of the batches,
training mode around the loop, the callback) is here, so the three cannot differ in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

TrainStep = Callable[[Any, Any, Mapping[str, Any], float], float]


def train_loop(
    model: Any,
    optimizer: Any,
    train_step: TrainStep,
    seed_dropout: Callable[[Any, int], None],
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
) -> list[float]:
    """``steps`` calls of ``train_step``, cycling through ``batches`` in order; returns the loss of
    every step, and calls ``callback(step, loss)`` (1-based) after each.

    The model trains in training mode (dropout on, if ``config.dropout > 0``, its masks drawn
    from ``seed``) and is left in inference mode, as ``build_model`` and ``load_model`` give it."""
    model.train()
    seed_dropout(model, seed)
    try:
        losses = []
        for t in range(1, steps + 1):
            losses.append(train_step(model, optimizer, batches[(t - 1) % len(batches)], label_smoothing))
            if callback is not None:
                callback(t, losses[-1])
        return losses
    finally:
        model.eval()
