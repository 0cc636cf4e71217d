"""Positional information: the paper's fixed sinusoids, or a learned table."""

from __future__ import annotations

import math

import numpy as np

from transformer_spec import Config

from .module import Module


def sinusoidal_table(max_len: int, d_model: int, dtype: str = "float32") -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Written so that an odd d_model works: there are ceil(d/2) sine columns but only
    floor(d/2) cosine columns (``pe[:, 1::2] = cos`` with ceil(d/2) frequencies fails).
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
    angle = position * np.exp(-math.log(10000.0) * two_i / d_model)  # (max_len, ceil(d/2))
    pe = np.zeros((max_len, d_model), dtype=np.float64)  # (max_len, d_model)
    pe[:, 0::2] = np.sin(angle)  # (max_len, ceil(d/2))
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])  # (max_len, floor(d/2))
    return pe.astype(dtype)  # (max_len, d_model)


class SinusoidalPositionalEncoding(Module):
    """A fixed table, not a parameter: nothing of it is saved in the weights."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.pe = sinusoidal_table(config.max_len, config.d_model, dtype)  # (max_len, d_model)

    def __call__(self, seq_len: int, offset: int = 0) -> np.ndarray:
        return self.pe[offset : offset + seq_len]  # (T, d_model)

    def backward(self, grad_output: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        """A constant of the positions: no parameters, and integer positions have no gradient."""
        return None, {}


class LearnedPositionalEmbedding(Module):
    """One trained vector per position (BERT, GPT)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.weight = np.zeros((config.max_len, config.d_model), dtype)

    def __call__(self, seq_len: int, offset: int = 0) -> np.ndarray:
        self.keep(seq_len=seq_len, offset=offset)  # differs: numpy-autograd
        return self.weight[offset : offset + seq_len]  # (T, d_model)

    def backward(self, grad_output: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        """grad_output (T, d_model) -> {"weight": (max_len, d_model)}: the rows read get it, the others 0."""
        seq_len, offset = self.saved.seq_len, self.saved.offset
        grad_weight = np.zeros_like(self.weight)  # (max_len, d_model)
        grad_weight[offset : offset + seq_len] = grad_output  # (T, d_model): a slice passes gradient through
        return None, {"weight": grad_weight}
