"""The two layouts of rotary position embedding, and the permutation between them.

Rotary position embedding (Su et al., 2021) rotates pairs of a head's query and key features
by an angle ``position * theta^(-2i/d_k)``, the i-th frequency for the i-th pair. Which two
features form the i-th pair is a convention, and the two in use differ:

* "halves" (HF Llama's ``rotate_half``): features i and i + d_k/2;
* "interleaved" (GGUF/GGML, GPT-J, Meta's original Llama code): features 2i and 2i + 1.

A model trained in one layout runs in the other once each head's query and key projection
columns are permuted so that the pairs land where the other layout looks for them: the
scores ``q . k`` are unchanged, since q and k are permuted alike (values and the output
projection are not touched). Mixing the layouts up gives no error, only plausible-looking
nonsense: a model whose text degrades after the first few tokens.

Weights here are our canonical [in, out] Linear weights: the permutation acts on the last
axis, head by head (``num_heads`` heads of ``d_k`` columns each; for grouped-query keys
pass the key/value head count).
"""

from __future__ import annotations

import numpy as np


def halves_to_interleaved_order(d_k: int) -> np.ndarray:
    """-> order (d_k,): interleaved feature j is halves feature order[j].

    Interleaved pair (2i, 2i + 1) is halves pair (i, i + d_k/2): order = [0, h, 1, h+1, ...]."""
    if d_k % 2:
        raise ValueError(f"rotary embedding needs an even head size, got d_k={d_k}")
    half = d_k // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # (d_k,)


def _permute_heads(weight: np.ndarray, num_heads: int, order: np.ndarray) -> np.ndarray:
    *lead, width = weight.shape
    if width % num_heads:
        raise ValueError(f"a projection of {width} output features cannot be split into {num_heads} heads")
    d_k = width // num_heads
    if order.shape != (d_k,):
        raise ValueError(f"{num_heads} heads of {d_k} features, but the permutation is for {order.shape[0]}")
    heads = weight.reshape(*lead, num_heads, d_k)  # (..., heads, d_k)
    return heads[..., order].reshape(weight.shape)  # (..., heads * d_k)


def halves_to_interleaved(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """A q or k projection (weight [in, heads * d_k], or its bias) for the "halves" layout ->
    the same projection for the "interleaved" layout."""
    d_k = weight.shape[-1] // num_heads
    return _permute_heads(weight, num_heads, halves_to_interleaved_order(d_k))


def interleaved_to_halves(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of :func:`halves_to_interleaved`: GGUF's q/k rows -> HF's."""
    d_k = weight.shape[-1] // num_heads
    return _permute_heads(weight, num_heads, np.argsort(halves_to_interleaved_order(d_k)))


def convert_rope_layout(params: dict[str, np.ndarray], config, to: str) -> dict[str, np.ndarray]:
    """Canonical weights of ``config`` (laid out for ``config.rope_layout``) -> the same model's
    weights for layout ``to``: every self-attention's w_q and w_k (weights and biases) permuted.

    Returns a new dict; run the model with ``config.replace(rope_layout=to)``."""
    if to not in ("halves", "interleaved"):
        raise ValueError(f"rope layout must be 'halves' or 'interleaved', got {to!r}")
    if config.positional != "rotary":
        raise ValueError(f"the model has positional={config.positional!r}, not 'rotary': nothing to convert")
    if to == config.rope_layout:
        return dict(params)
    permute = halves_to_interleaved if to == "interleaved" else interleaved_to_halves
    out = dict(params)
    for name, value in params.items():
        parts = name.split(".")
        in_self_attention = len(parts) == 2 or parts[-3] == "self_attn"  # a whole model, or one attention
        if in_self_attention and len(parts) >= 2 and parts[-2] in ("w_q", "w_k"):
            heads = config.num_heads if parts[-2] == "w_q" else config.num_kv_heads
            out[name] = permute(value, heads)
    return out
