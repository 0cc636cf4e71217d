"""The residual connection around every sub-layer, written once (paper, section 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import Array

from .layer_norm import LayerNorm
from .layers import Dropout


def sublayer_connection(
    x: Array,
    sublayer: Callable[[Array], tuple[Array, Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[Array, Any]:
    """Post-norm (the paper): LayerNorm(x + Dropout(sublayer(x))).
    Pre-norm: x + Dropout(sublayer(LayerNorm(x))).

    ``sublayer`` returns (output, extra), the extra being attention weights or None.
    Pre-norm keeps an un-normalised residual path from input to output, which trains
    deep stacks without warm-up, but then the stack needs a final LayerNorm. Dropout
    (section 5.4: "to the output of each sub-layer, before it is added to the
    sub-layer input") is the identity in inference mode.
    """
    if dropout is None:
        dropout = lambda y: y  # noqa: E731
    # JAX: norm_first comes from the config, a Python bool: under jit this if is decided once
    if norm_first:
        y, extra = sublayer(norm(x))  # (B, T, d_model)
        return x + dropout(y), extra  # (B, T, d_model)
    y, extra = sublayer(x)  # (B, T, d_model)
    return norm(x + dropout(y)), extra  # (B, T, d_model)
