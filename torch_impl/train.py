"""Training: one step is loss, gradients (``loss.backward()``, autograd), and an Adam update."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from transformer_spec.batches import split_batch
from transformer_spec.train import train_loop

from .layers import seed_dropout
from .loss import cross_entropy
from .optim import Adam


def train_step(model, optimizer: Adam, batch: Mapping[str, Any], label_smoothing: float = 0.0) -> float:
    """One update on ``batch`` (see transformer_spec.batches); returns the loss before it."""
    inputs, targets = split_batch(model.config, batch)
    # differs: framework-autograd
    with torch.enable_grad():  # callers may hold a no_grad context (evaluation, tests)
        logits = model(*(torch.as_tensor(x) for x in inputs)).logits  # (B, T, V)
        loss = cross_entropy(logits, torch.as_tensor(targets), model.config.pad_id, label_smoothing)  # ()
        loss.backward()  # fills every parameter's .grad
    optimizer.step()
    return float(loss.detach())


def train(
    model,
    batches: Sequence[Mapping[str, Any]],
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
