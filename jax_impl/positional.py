"""Positional information: the paper's fixed sinusoids, or a learned table."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer_spec import Config


class Buffer(nnx.Variable):
    """A non-trainable array that belongs to a module (torch's ``register_buffer``).

    An ``nnx.Variable`` but not an ``nnx.Param``: ``nnx.state(model, nnx.Param)``,
    optimisers and ``to_params`` leave it out, while ``nnx.split`` still carries it
    into a jitted function as an ordinary input (not baked in as a constant).
    """


def sinusoidal_table(max_len: int, d_model: int, dtype: str = "float32") -> jax.Array:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Written so that an odd d_model works: there are ceil(d/2) sine columns but only
    floor(d/2) cosine columns (``pe[:, 1::2] = cos`` with ceil(d/2) frequencies fails).

    JAX difference: JAX has float64 only when ``jax_enable_x64`` is on. Computed in
    float32, the rounding of the angle (up to pos * 2^-24 rad) would leave entries ~4e-6
    off at max_len=64 and ~3e-5 at 512, so the table, a constant, is computed on the
    host with NumPy in float64 (as the other backends do) and only then handed to JAX.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
    angle = position * np.exp(-math.log(10000.0) * two_i / d_model)  # (max_len, ceil(d/2))
    pe = np.zeros((max_len, d_model), dtype=np.float64)  # (max_len, d_model)
    pe[:, 0::2] = np.sin(angle)  # (max_len, ceil(d/2))
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])  # (max_len, floor(d/2))
    return jnp.asarray(pe, dtype=dtype)  # (max_len, d_model); differs: jax-host-float64


class SinusoidalPositionalEncoding(nnx.Module):
    """A fixed table, not a parameter: nothing of it is saved in the weights."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.pe = Buffer(sinusoidal_table(config.max_len, config.d_model, dtype))  # (max_len, d_model)

    def __call__(self, seq_len: int, offset: int | jax.Array = 0) -> jax.Array:
        return _rows(self.pe, seq_len, offset)  # (T, d_model); differs: jit-static-shapes


class LearnedPositionalEmbedding(nnx.Module):
    """One trained vector per position (BERT, GPT)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.weight = nnx.Param(jnp.zeros((config.max_len, config.d_model), dtype))  # (max_len, d_model)

    def __call__(self, seq_len: int, offset: int | jax.Array = 0) -> jax.Array:
        return _rows(self.weight, seq_len, offset)  # (T, d_model); differs: jit-static-shapes


def _rows(table: nnx.Variable, seq_len: int, offset: int | jax.Array) -> jax.Array:  # differs: jit-static-shapes
    """Rows offset .. offset + seq_len - 1 of a (max_len, d_model) table -> (T, d_model).

    seq_len is a Python int (a shape). So is offset in a forward pass, and the slice is
    static under jit. A cached decoding step (generate.py) passes a traced offset, so that
    one compiled step serves every position: then the slice's start is known only at run
    time, which ``dynamic_slice`` allows (it clamps a start past the end rather than raise:
    the caller checks positions eagerly).
    """
    if isinstance(offset, int):
        return table[offset : offset + seq_len]  # (T, d_model)
    return jax.lax.dynamic_slice_in_dim(table[...], offset, seq_len, axis=0)  # (T, d_model)
