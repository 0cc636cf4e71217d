"""The pitfall "sinusoidal-odd-d-model": The sinusoidal encoding fails for an odd d_model."""

from __future__ import annotations

import math

import numpy as np

from .common import _backend, _error, _g
from .registry import BACKENDS, Demonstration, register, source


def wrong_sinusoidal_table_numpy(max_len, d_model):
    pe = np.zeros((max_len, d_model))
    position = np.arange(0, max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    div_term = np.exp(np.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (ceil(d_model / 2),)
    pe[:, 0::2] = np.sin(position * div_term)  # ceil(d_model / 2) columns: fits
    pe[:, 1::2] = np.cos(position * div_term)  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


def wrong_sinusoidal_table_jax(max_len, d_model):
    import jax.numpy as jnp

    pe = jnp.zeros((max_len, d_model))
    position = jnp.arange(0, max_len, dtype=float)[:, None]  # (max_len, 1)
    div_term = jnp.exp(jnp.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (ceil(d_model / 2),)
    pe = pe.at[:, 0::2].set(jnp.sin(position * div_term))  # ceil(d_model / 2) columns: fits
    pe = pe.at[:, 1::2].set(jnp.cos(position * div_term))  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


def wrong_sinusoidal_table_torch(max_len, d_model):
    import torch

    pe = torch.zeros(max_len, d_model)  # from-scratch's PositionalEncoding.__init__, line for line
    position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)  # (max_len, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)  # ceil(d_model / 2) columns: fits
    pe[:, 1::2] = torch.cos(position * div_term)  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


WRONG_SINUSOIDAL = {
    "numpy": wrong_sinusoidal_table_numpy,
    "jax": wrong_sinusoidal_table_jax,
    "torch": wrong_sinusoidal_table_torch,
}


def ours_sinusoidal_table(impl, max_len, d_model):
    return impl.sinusoidal_table(max_len, d_model, "float64")  # (max_len, d_model), any d_model


@register(
    "sinusoidal-odd-d-model",
    "The sinusoidal encoding fails for an odd d_model",
    BACKENDS,
    tutorials=("from-scratch",),
)
def sinusoidal_odd_d_model(backend: str) -> Demonstration:
    """The classic table writes sin into the even columns and cos into the odd ones, both from
    the same ceil(d/2) frequencies. For an odd d_model there are ceil(d/2) even columns but only
    floor(d/2) odd ones, so the cos assignment cannot fit: NumPy, JAX and torch all raise. It
    works for every even size, which is why it is copied everywhere. Ours gives the odd columns
    only the first floor(d/2) frequencies, and agrees with the classic code for even d_model."""
    b = _backend(backend)
    wrong, max_len = WRONG_SINUSOIDAL[backend], 6
    error_type, error = _error(lambda: wrong(max_len, 7))
    wrong_even = np.asarray(b.to_numpy(wrong(max_len, 8)), dtype=np.float64)  # (max_len, 8)
    ours_even = b.to_numpy(ours_sinusoidal_table(b.impl, max_len, 8))  # (max_len, 8)
    ours_odd = b.to_numpy(ours_sinusoidal_table(b.impl, max_len, 7))  # (max_len, 7)
    numbers = {
        "wrong_error_type": error_type,
        "wrong_error": error,
        "even_max_difference": float(np.abs(wrong_even - ours_even).max()),
        "ours_odd_shape": tuple(ours_odd.shape),
        "ours_odd_finite": bool(np.isfinite(ours_odd).all()),
    }
    return Demonstration(
        pitfall="sinusoidal-odd-d-model",
        backend=backend,
        wrong_code=source(wrong),
        ours_code=source(ours_sinusoidal_table),
        wrong=f"d_model=7 raises {error_type}: {error}",
        ours=(
            f"d_model=7 gives a {ours_odd.shape} table; d_model=8 equals the classic code to "
            f"{_g(numbers['even_max_difference'])}"
        ),
        numbers=numbers,
        arrays={"ours_odd": ours_odd, "max_len": max_len},
    )
