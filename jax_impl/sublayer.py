"""The residual connection around every sub-layer, written once (paper, section 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .layer_norm import LayerNorm


def sublayer_connection(
    x: jax.Array,
    sublayer: Callable[[jax.Array], tuple[jax.Array, Any]],
    norm: LayerNorm,
    norm_first: bool,
) -> tuple[jax.Array, Any]:
    """Post-norm (the paper): LayerNorm(x + sublayer(x)). Pre-norm: x + sublayer(LayerNorm(x)).

    ``sublayer`` returns (output, extra), the extra being attention weights or None.
    Pre-norm keeps an un-normalised residual path from input to output, which trains
    deep stacks without warm-up, but then the stack needs a final LayerNorm.
    (``norm_first`` comes from the config, a Python bool: under jit this ``if`` is
    decided once, at trace time.)
    """
    if norm_first:
        y, extra = sublayer(norm(x))  # (B, T, d_model)
        return x + y, extra  # (B, T, d_model)
    y, extra = sublayer(x)  # (B, T, d_model)
    return norm(x + y), extra  # (B, T, d_model)
