"""Learning-rate schedules as plain functions of the step (1-based), shared by the backends.

torch wraps them in ``LambdaLR``, optax calls them with the step count, NumPy's Adam
reads them directly: the same numbers everywhere.
"""

from __future__ import annotations

import math


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
