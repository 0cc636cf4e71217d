"""Learning-rate schedules as plain functions of the step (1-based), and the training loop,
shared by the backends.

torch wraps them in ``LambdaLR``, optax calls them with the step count, NumPy's Adam
reads them directly: the same numbers everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def warmup_schedule(d_model: int, warmup_steps: int = 4000, factor: float = 1.0):
    """The paper's (section 5.3): lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Linear warm-up for ``warmup_steps``, then decay with the inverse square root of the step.
    """
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps must be positive, got {warmup_steps}")

    def learning_rate(step: int) -> float:
        step = max(int(step), 1)
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    return learning_rate


def constant_schedule(value: float):
    def learning_rate(step: int) -> float:
        return value

    return learning_rate


def peak(schedule, steps: int) -> float:
    """The largest rate over the first ``steps`` steps (for printing)."""
    return max(schedule(s) for s in range(1, steps + 1)) if steps > 0 else math.nan


def run_steps(
    step: Callable[[Mapping[str, Any]], float],
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """The training loop every backend shares: ``step(batch) -> loss`` for ``steps`` steps,
    cycling through ``batches`` in order; ``callback(step, loss)`` after each. Returns the losses."""
    losses = []
    for t in range(1, steps + 1):
        losses.append(step(batches[(t - 1) % len(batches)]))
        if callback is not None:
            callback(t, losses[-1])
    return losses
