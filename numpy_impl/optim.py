"""Adam (Kingma & Ba, 2015), written out: the update torch.optim.Adam and optax.adam make.

    m <- b1 m + (1 - b1) g            v <- b2 v + (1 - b2) g^2
    m_hat = m / (1 - b1^t)            v_hat = v / (1 - b2^t)
    p <- p - lr_t * m_hat / (sqrt(v_hat) + eps)

``lr_t = schedule(t)`` with t = 1, 2, ... (transformer_run.schedules). The paper uses
b1 = 0.9, b2 = 0.98, eps = 1e-9 (section 5.3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from transformer_spec import param_schema, parent_of


class Adam:
    def __init__(
        self,
        model,
        schedule: Callable[[int], float],
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
    ):
        self.model, self.schedule, self.betas, self.eps = model, schedule, betas, eps
        self.names = list(param_schema(model.config, model.schema))
        self.m = {name: np.zeros_like(self._param(name)) for name in self.names}  # first moments
        self.v = {name: np.zeros_like(self._param(name)) for name in self.names}  # second moments
        self.t = 0

    def _param(self, name: str) -> np.ndarray:  # differs: framework-optimizer
        parent, leaf = parent_of(self.model, name)
        return getattr(parent, leaf)

    def step(self, grads: Mapping[str, np.ndarray]) -> float:
        """Update every parameter in place from its gradient; returns the learning rate used."""
        self.t += 1
        b1, b2 = self.betas
        lr = float(self.schedule(self.t))
        # early moments are biased to 0
        correction1, correction2 = 1.0 - b1**self.t, 1.0 - b2**self.t
        for name in self.names:
            g, m, v = grads[name], self.m[name], self.v[name]
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * g * g
            param = self._param(name)
            # in place: the model's array
            param -= lr * (m / correction1) / (np.sqrt(v / correction2) + self.eps)
        return lr
