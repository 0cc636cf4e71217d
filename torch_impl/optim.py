"""Adam: PyTorch's own ``torch.optim.Adam``, its learning rate set each step from a schedule.

torch computes ``p <- p - lr_t / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``, the
same update as numpy_impl's written-out Adam. ``LambdaLR`` multiplies the base rate (1.0
here) by ``schedule``; it calls it with 0 before the first step, so we shift by one to
give step t the rate ``schedule(t)``, as the other backends do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Adam:
    def __init__(
        self,
        model: torch.nn.Module,
        schedule: Callable[[int], float],
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
    ):
        self.model, self.schedule, self.betas, self.eps = model, schedule, betas, eps
        # differs: framework-optimizer
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=betas, eps=eps)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda t: schedule(t + 1)
        )
        self.t = 0

    def step(self, grads=None) -> float:  # differs: framework-optimizer
        """Apply the gradients that ``loss.backward()`` left in each ``.grad``; returns the
        learning rate used."""
        self.t += 1
        # differs: framework-optimizer
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()
        return float(lr)
