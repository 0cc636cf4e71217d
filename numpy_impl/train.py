"""Training: one step is loss, gradients (the hand-written backward), and an Adam update."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from transformer_spec.schedules import run_steps

from .layers import seed_dropout
from .optim import Adam
from .training import loss_and_grads


def train_step(model, optimizer: Adam, batch: Mapping[str, np.ndarray], label_smoothing: float = 0.0) -> float:
    """One update on ``batch`` (see transformer_spec.batches); returns the loss before it."""
    loss, grads = loss_and_grads(model, batch, label_smoothing)
    optimizer.step(grads)
    return loss


def train(
    model,
    batches: Sequence[Mapping[str, np.ndarray]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
) -> list[float]:
    """``steps`` updates cycling through ``batches`` in order; returns the loss of every step.

    ``callback(step, loss)`` runs after each step (a progress bar, say). The model trains in
    training mode (dropout masks drawn from ``seed``) and is left in inference mode."""
    optimizer = Adam(model, schedule)
    model.train()  # dropout on (if config.dropout > 0), drawn from ``seed``
    seed_dropout(model, seed)
    try:
        return run_steps(lambda batch: train_step(model, optimizer, batch, label_smoothing), batches, steps, callback)
    finally:
        model.eval()  # back to inference, as build_model and load_model give it
