"""Position-wise feed-forward network: two linear maps with a non-linearity between."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from transformer_spec import Config
from transformer_spec.trace import record

from .layers import Dropout, Linear, Module, with_prefix


def relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 0.0)  # (written so that its gradient at exactly 0 is 0, as torch's)


def relu_backward(x: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """d relu / dx = 1 where x > 0, else 0 (also at exactly 0, as torch)."""
    return np.where(x > 0, grad_output, 0.0)  # (...,)


# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (outside it erf is +-1 to float32 precision): the
# float32 approximation of Eigen and XLA's older erf, within 5e-7 of the exact erf.
# Coefficients from the highest power down, as np.polyval takes them.
_ERF_P = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                   -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02], np.float32)  # fmt: skip
_ERF_Q = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                   -1.42647390514189e-02], np.float32)  # fmt: skip


_ERF_BLOCK = 1 << 16  # elements per block: 256 KiB of float32, which stays in the CPU's cache


def _erf(z: np.ndarray) -> np.ndarray:
    """erf, elementwise. ``scipy.special.erf`` runs a scalar loop (~15 ns an element, most
    of a BERT forward's GELU time): float64 keeps it (exact, for the parity tests), float32
    takes the rational approximation above, ~2x faster. It runs block by block: its dozen
    NumPy passes then read the cache, not memory, and allocate no array as large as z."""
    if z.dtype != np.float32:
        return special.erf(z)
    flat, out = z.reshape(-1), np.empty(z.size, z.dtype)  # (N,) each
    for start in range(0, z.size, _ERF_BLOCK):
        x = np.clip(flat[start : start + _ERF_BLOCK], -4.0, 4.0)  # (block,)
        x2 = x * x  # (block,)
        out[start : start + _ERF_BLOCK] = x * np.polyval(_ERF_P, x2) / np.polyval(_ERF_Q, x2)
    return out.reshape(z.shape)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) (torch ``nn.GELU()``, BERT's "gelu")."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_backward(x: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), with phi the standard normal density."""
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))  # (...,) Phi(x)
    pdf = np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)  # (...,) phi(x)
    return grad_output * (cdf + x * pdf)  # (...,)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation (GPT-2; ``jax.nn.gelu``'s default): up to ~5e-4 off the exact one."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_tanh_backward(x: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """With u = sqrt(2/pi) (x + 0.044715 x^3): d/dx [x (1 + tanh u) / 2]
    = (1 + tanh u) / 2 + x (1 - tanh^2 u) / 2 * sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    tanh_u = np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))  # (...,)
    du_dx = math.sqrt(2.0 / math.pi) * (1.0 + 3.0 * 0.044715 * x**2)  # (...,)
    return grad_output * (0.5 * (1.0 + tanh_u) + 0.5 * x * (1.0 - tanh_u**2) * du_dx)  # (...,)


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}
ACTIVATION_BACKWARDS = {"relu": relu_backward, "gelu": gelu_backward, "gelu_tanh": gelu_tanh_backward}


class PositionwiseFeedForward(Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, the same two matrices at every position."""

    schema = "feed_forward"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.w_1 = Linear(config.d_model, config.d_ff, config.bias, dtype)
        self.w_2 = Linear(config.d_ff, config.d_model, config.bias, dtype)
        self.activation = ACTIVATIONS[config.activation]
        self.activation_backward = ACTIVATION_BACKWARDS[config.activation]
        self.dropout = Dropout(config.dropout)  # on the hidden layer

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward_for_backward(x)[0]  # (B, T, d_model) -> (B, T, d_ff) -> (B, T, d_model)

    def forward_for_backward(self, x: np.ndarray) -> tuple[np.ndarray, tuple]:
        pre_activation, w_1_saved = self.w_1.forward_for_backward(x)  # (B, T, d_ff)
        hidden = self.activation(pre_activation)  # (B, T, d_ff)
        record(self, "hidden", hidden)
        hidden, dropout_saved = self.dropout.forward_for_backward(hidden)  # (B, T, d_ff)
        output, w_2_saved = self.w_2.forward_for_backward(hidden)  # (B, T, d_model)
        record(self, "output", output)
        return output, (w_1_saved, pre_activation, dropout_saved, w_2_saved)

    def backward(self, saved: tuple, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (B, T, d_model) -> grad_x (B, T, d_model), grads of w_1 and w_2."""
        w_1_saved, pre_activation, dropout_saved, w_2_saved = saved
        grad_hidden, w_2_grads = self.w_2.backward(w_2_saved, grad_output)  # (B, T, d_ff)
        grad_hidden, _ = self.dropout.backward(dropout_saved, grad_hidden)  # (B, T, d_ff)
        grad_pre_activation = self.activation_backward(pre_activation, grad_hidden)  # (B, T, d_ff)
        grad_x, w_1_grads = self.w_1.backward(w_1_saved, grad_pre_activation)  # (B, T, d_model)
        return grad_x, with_prefix("w_1", w_1_grads) | with_prefix("w_2", w_2_grads)
