"""Converters between weight layouts (pure NumPy)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .config import Config


def attention_to_heads(params: Mapping[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
    """Fused multi-head attention weights -> the tutorials' list of ``AttentionHead``s.

    Head h of the fused layer owns columns [h*d_k, (h+1)*d_k) of w_q, w_k and w_v:
    that is exactly what ``split_heads`` (reshape to (B, T, H, d_k)) assumes.
    """
    d_k = config.d_k
    heads: dict[str, np.ndarray] = {}
    for h in range(config.num_heads):
        columns = slice(h * d_k, (h + 1) * d_k)
        for name in ("w_q", "w_k", "w_v"):
            heads[f"heads.{h}.{name}.weight"] = params[f"{name}.weight"][:, columns].copy()
            if f"{name}.bias" in params:
                heads[f"heads.{h}.{name}.bias"] = params[f"{name}.bias"][columns].copy()
    heads["w_o.weight"] = params["w_o.weight"].copy()
    if "w_o.bias" in params:
        heads["w_o.bias"] = params["w_o.bias"].copy()
    return heads
