"""Training: one step is loss, gradients (the hand-written backward), and an Adam update."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from transformer_spec.train import train_loop

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
    """``steps`` Adam updates at ``schedule``'s rates, cycling through ``batches`` in order;
    returns the loss of every step. The loop itself (training mode with dropout drawn from
    ``seed``, ``callback(step, loss)``, back to inference mode) is ``transformer_spec.train``'s."""
    optimizer = Adam(model, schedule)
    return train_loop(model, optimizer, train_step, seed_dropout, batches, steps, label_smoothing, callback, seed)
