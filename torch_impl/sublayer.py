"""The residual connection around every sub-layer, written once (paper, section 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .layer_norm import LayerNorm


def sublayer_connection(
    x: torch.Tensor,
    sublayer: Callable[[torch.Tensor], tuple[torch.Tensor, Any]],
    norm: LayerNorm,
    norm_first: bool,
) -> tuple[torch.Tensor, Any]:
    """Post-norm (the paper): LayerNorm(x + sublayer(x)). Pre-norm: x + sublayer(LayerNorm(x)).

    ``sublayer`` returns (output, extra), the extra being attention weights or None.
    Pre-norm keeps an un-normalised residual path from input to output, which trains
    deep stacks without warm-up, but then the stack needs a final LayerNorm.
    """
    if norm_first:
        y, extra = sublayer(norm(x))
        return x + y, extra
    y, extra = sublayer(x)
    return norm(x + y), extra
