"""Adam: optax's ``optax.adam`` inside Flax's ``nnx.Optimizer``, its learning rate set each
step from a schedule.

optax computes ``p <- p - lr_t * m_hat / (sqrt(v_hat) + eps)``, numpy_impl's written-out
update. ``inject_hyperparams`` keeps the learning rate in the optimizer state, so the
Python schedule (transformer_run.schedules) sets it before each jitted step; optax's own
schedules would count steps from 0, ours from 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import optax
from flax import nnx


@functools.cache
def _adam(b1: float, b2: float, eps: float):  # differs: framework-optimizer
    """optax's Adam, its hyperparameters held in its state (``inject_hyperparams``; the rate is
    set before each step), one transformation for each (b1, b2, eps): Flax keeps it in the
    optimizer's graph, so two optimizers that share it have the same graph, and a step jitted
    (and compiled) for one model and optimizer runs again for another of the same structure,
    where a new transformation each time would compile the step again."""
    return optax.inject_hyperparams(optax.adam)(learning_rate=0.0, b1=b1, b2=b2, eps=eps)


class Adam:
    def __init__(
        self,
        model: nnx.Module,
        schedule: Callable[[int], float],
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
    ):
        self.model, self.schedule, self.betas, self.eps = model, schedule, betas, eps
        self.optimizer = nnx.Optimizer(model, _adam(*betas, eps), wrt=nnx.Param)
        self.t = 0

    def set_learning_rate(self) -> float:  # differs: framework-optimizer
        """Advance to the next step and store its rate in the optimizer state; returns it."""
        self.t += 1
        lr = float(self.schedule(self.t))
        self.optimizer.opt_state.hyperparams["learning_rate"][...] = lr
        return lr

    def step(self, grads: nnx.State) -> float:
        """Apply ``grads`` (an nnx.State shaped like the model's Params); returns the learning
        rate used."""
        lr = self.set_learning_rate()
        self.optimizer.update(self.model, grads)
        return lr
