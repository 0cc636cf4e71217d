"""The two building blocks NumPy lacks: a linear layer and an embedding table.

(PyTorch has ``nn.Linear``/``nn.Embedding`` and Flax ``nnx.Linear``; see
``transformer_spec.schema`` for how their layouts map onto ours.)
"""

from __future__ import annotations

import numpy as np


class Linear:
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype: str = "float32"):
        self.weight = np.zeros((d_in, d_out), dtype)
        self.bias = np.zeros((d_out,), dtype) if bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight  # (..., d_in) @ (d_in, d_out) -> (..., d_out)
        return y + self.bias if self.bias is not None else y
