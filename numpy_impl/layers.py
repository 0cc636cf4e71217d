"""The two building blocks NumPy lacks: a linear layer and an embedding table.

(PyTorch has ``nn.Linear``/``nn.Embedding`` and Flax ``nnx.Linear``; see
``transformer_spec.schema`` for how their layouts map onto ours.)

NumPy has no autograd, so every module here also has a hand-written backward pass
(llm.c style), next to its forward:

* ``forward_for_backward(...)`` returns ``(what __call__ returns, saved)``: the same
  computation (``__call__`` calls it and drops ``saved``), plus the intermediate arrays
  the backward pass needs.
* ``backward(saved, grad_output)`` returns ``(grad_inputs, grads)``: the gradient of a
  scalar loss with respect to the float inputs, and ``grads``, a dict from parameter
  names relative to the module (``"w_q.weight"``) to gradients, named exactly as in
  ``transformer_spec.param_schema``. Gradients with respect to integer ids are None.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def with_prefix(prefix: str, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{"weight": g} -> {"w_q.weight": g}: a submodule's gradients under its name in the parent."""
    return {f"{prefix}.{name}": grad for name, grad in grads.items()}


class Linear:
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype: str = "float32"):
        self.weight = np.zeros((d_in, d_out), dtype)
        self.bias = np.zeros((d_out,), dtype) if bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward_for_backward(x)[0]

    def forward_for_backward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = x @ self.weight  # (..., d_in) @ (d_in, d_out) -> (..., d_out)
        return (y + self.bias if self.bias is not None else y), x  # the backward needs only the input

    def backward(self, saved: np.ndarray, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (..., d_out) -> grad_x (..., d_in), {"weight": (d_in, d_out), "bias": (d_out,)}."""
        x = saved  # (..., d_in)
        # y = x W: dx = dy W^T
        grad_x = grad_output @ self.weight.T  # (..., d_out) @ (d_out, d_in) -> (..., d_in)
        # every position used the same W: its gradient sums x^T dy over all of them
        rows_x = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (N, d_out)
        grads = {"weight": rows_x.T @ rows_grad}  # (d_in, N) @ (N, d_out) -> (d_in, d_out)
        if self.bias is not None:
            grads["bias"] = rows_grad.sum(axis=0)  # (d_out,), added at every position
        return grad_x, grads
