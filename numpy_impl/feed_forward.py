"""Position-wise feed-forward network: two linear maps with a non-linearity between."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

from transformer_spec import Config

from .layers import Linear


def relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 0.0)  # (written so that its gradient at exactly 0 is 0, as torch's)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) (torch ``nn.GELU()``, BERT's "gelu")."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation (GPT-2; ``jax.nn.gelu``'s default): up to ~5e-4 off the exact one."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


class PositionwiseFeedForward:
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, the same two matrices at every position."""

    schema = "feed_forward"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.w_1 = Linear(config.d_model, config.d_ff, config.bias, dtype)
        self.w_2 = Linear(config.d_ff, config.d_model, config.bias, dtype)
        self.activation = ACTIVATIONS[config.activation]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.w_2(self.activation(self.w_1(x)))  # (B, T, d_model) -> (B, T, d_ff) -> (B, T, d_model)
