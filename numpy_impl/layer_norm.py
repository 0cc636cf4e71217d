"""Layer normalisation (Ba et al., 2016) over the last (feature) axis."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config


class LayerNorm:
    """``(x - mean) / sqrt(var + eps) * weight + bias``.

    The variance is the *biased* one (divide by d, not d - 1) and eps sits inside the
    square root: that is what torch, Flax and BERT compute. (A common hand-written
    version uses ``x.std()`` -- unbiased -- and adds eps to the std: close, not equal.)
    """

    schema = "layer_norm"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.eps = float(config.layer_norm_eps)
        self.weight = np.ones((config.d_model,), dtype)
        self.bias = np.zeros((config.d_model,), dtype) if config.bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), biased
        x_hat = (x - mean) / np.sqrt(var + self.eps)  # (..., d_model)
        y = x_hat * self.weight
        return y + self.bias if self.bias is not None else y
