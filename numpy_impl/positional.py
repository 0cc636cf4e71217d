"""Positional information: the paper's fixed sinusoids, a learned table, or rotary position
embedding."""

from __future__ import annotations

import math

import numpy as np
from numpy import ndarray as Array

from transformer_spec import Config
from transformer_spec.checks import check_rows

from .layers import parameter
from .module import Module

Position = int  # where a sequence starts (JAX also takes a traced integer, in a compiled step)


def sinusoidal_table(
    max_len: int, d_model: int, dtype: str = "float32", layout: str = "interleaved"
) -> Array:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Written so that an odd d_model works: there are ceil(d/2) sine columns but only
    floor(d/2) cosine columns (``pe[:, 1::2] = cos`` with ceil(d/2) frequencies fails).
    ``layout="halves"`` puts the same columns in another order: every sine, then every
    cosine (Marian, fairseq): PE[pos, i] = sin(...), PE[pos, ceil(d/2) + i] = cos(...).

    Computed in float64, then cast to ``dtype``: in float32 the rounding of the angle (up to
    pos * 2^-24 rad) would leave entries ~4e-6 off at max_len=64 and ~3e-5 at 512. JAX has
    float64 only when ``jax_enable_x64`` is on, so jax_impl computes the table, a constant, on
    the host with NumPy (as the other backends compute it) and only then hands it to JAX.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
    angle = position * np.exp(-math.log(10000.0) * two_i / d_model)  # (max_len, ceil(d/2))
    pe = np.zeros((max_len, d_model), dtype=np.float64)  # (max_len, d_model)
    if layout == "halves":
        sines = angle.shape[1]
        pe[:, :sines] = np.sin(angle)  # (max_len, ceil(d/2))
        pe[:, sines:] = np.cos(angle[:, : d_model // 2])  # (max_len, floor(d/2))
    else:
        pe[:, 0::2] = np.sin(angle)  # (max_len, ceil(d/2))
        pe[:, 1::2] = np.cos(angle[:, : d_model // 2])  # (max_len, floor(d/2))
    return pe.astype(dtype)  # (max_len, d_model)


class SinusoidalPositionalEncoding(Module):
    """A fixed table, not a parameter: nothing of it is saved in the weights (torch: a
    non-persistent buffer, which moves with ``.to(device)`` but is not in the state_dict)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        pe = sinusoidal_table(config.max_len, config.d_model, dtype, config.sinusoid_layout)
        self.pe = pe  # (max_len, d_model)

    def __call__(self, seq_len: int, offset: Position = 0) -> Array:
        check_rows(offset, seq_len, self.pe.shape[0])  # rows offset .. offset + T - 1 exist
        return _rows(self.pe, seq_len, offset)  # (T, d_model)

    def backward(self, grad_output: Array) -> tuple[None, dict[str, Array]]:
        """A constant of the positions: no parameters, and integer positions have no gradient."""
        return None, {}


class LearnedPositionalEmbedding(Module):
    """One trained vector per position (BERT, GPT)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.weight = parameter((config.max_len, config.d_model), dtype)

    def __call__(self, seq_len: int, offset: Position = 0) -> Array:
        check_rows(offset, seq_len, self.weight.shape[0])  # rows offset .. offset + T - 1 exist
        self.keep(seq_len=seq_len, offset=offset)  # differs: numpy-autograd
        return _rows(self.weight, seq_len, offset)  # (T, d_model)

    def backward(self, grad_output: Array) -> tuple[None, dict[str, Array]]:
        """grad_output (T, d_model) -> {"weight": (max_len, d_model)}: the rows read get it,
        the others 0."""
        seq_len, offset = self.saved.seq_len, self.saved.offset
        grad_weight = np.zeros_like(self.weight)  # (max_len, d_model)
        # (T, d_model): a slice passes gradient through
        grad_weight[offset : offset + seq_len] = grad_output
        return None, {"weight": grad_weight}


def rotary_tables(
    max_len: int, d_k: int, theta: float, dtype: str = "float32"
) -> tuple[Array, Array]:
    """-> cos, sin (max_len, d_k / 2) of the angles pos * theta^(-2i / d_k), i = 0 .. d_k/2 - 1.

    Pair i turns once every 2 pi theta^(2i/d_k) positions: the first pair fastest (one radian
    a position), the last slowest. Computed in float64, then cast (HF computes the angles in
    float32: at position p they differ from these by about p * 6e-8 radians); in jax_impl, as
    the sinusoids, on the host with NumPy: float64 even without ``jax_enable_x64``.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    inv_freq = theta ** (-np.arange(0, d_k, 2, dtype=np.float64) / d_k)  # (d_k / 2,)
    angle = position * inv_freq  # (max_len, d_k / 2)
    cos, sin = np.cos(angle), np.sin(angle)  # (max_len, d_k / 2) each
    return cos.astype(dtype), sin.astype(dtype)  # (max_len, d_k / 2) each


def rotate_pairs(x: Array, cos: Array, sin: Array, layout: str) -> Array:
    """Each pair (x1, x2) of x's last axis -> (x1 cos - x2 sin, x2 cos + x1 sin): a 2-D rotation.

    ``layout`` says which features pair up: "halves", i and i + d_k/2 (HF's ``rotate_half``);
    "interleaved", 2i and 2i + 1 (GGUF, GPT-J). x (..., T, d_k), cos and sin (T, d_k/2)."""
    if layout == "halves":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]  # (..., T, d_k / 2) each
        halves = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]  # (..., T, d_k / 2) each
        return np.concatenate(halves, axis=-1)  # (..., T, d_k)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d_k / 2) each
    pairs = np.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (..., T, d_k / 2, 2)
    return pairs.reshape(x.shape)  # (..., T, d_k)


class RotaryEmbedding(Module):
    """Rotary position embedding (Su et al., 2021, RoFormer): queries and keys, not embeddings.

    Each head's query and key at position m are rotated, pair of features by pair, by the
    angles m * theta^(-2i/d_k). A rotation by m then one by -n is one by m - n, so the score
    q_m . k_n depends on the two positions only through m - n: attention sees relative
    positions, and nothing is added to the token embeddings. A fixed function of the
    positions, like the sinusoids: no weights (torch: non-persistent buffers).
    """

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.layout = config.rope_layout
        # (max_len, d_k / 2) each
        cos, sin = rotary_tables(config.max_len, config.d_k, config.rope_theta, dtype)
        self.cos = cos
        self.sin = sin

    def __call__(self, x: Array, offset: Position = 0) -> Array:
        """x (B, H, T, d_k) at positions offset .. offset + T - 1 -> x rotated (B, H, T, d_k)."""
        seq_len = x.shape[-2]
        check_rows(offset, seq_len, self.cos.shape[0])  # rows offset .. offset + T - 1 exist
        cos = _rows(self.cos, seq_len, offset)  # (T, d_k / 2)
        sin = _rows(self.sin, seq_len, offset)  # (T, d_k / 2)
        self.keep(offset=offset)  # differs: numpy-autograd
        return rotate_pairs(x, cos, sin, self.layout)  # (B, H, T, d_k)

    def backward(self, grad_output: Array) -> tuple[Array, dict[str, Array]]:
        """grad_output (B, H, T, d_k) -> grad_x: a rotation's gradient is the rotation back (its
        transpose), by -angle. No parameters. (Called for queries and keys alike: both kept the
        same offset.)"""
        offset, seq_len = self.saved.offset, grad_output.shape[-2]
        cos = _rows(self.cos, seq_len, offset)  # (T, d_k / 2)
        sin = _rows(self.sin, seq_len, offset)  # (T, d_k / 2)
        return rotate_pairs(grad_output, cos, -sin, self.layout), {}  # (B, H, T, d_k)


def _rows(table: Array, seq_len: int, offset: Position) -> Array:
    """Rows offset .. offset + seq_len - 1 of a (max_len, d_model) table -> (T, d_model)."""
    return table[offset : offset + seq_len]  # (T, d_model)
