"""The pitfall "gqa-repeat-order": Grouped-query attention with the key/value heads tiled, not repeated."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transformer_spec import Config

from .common import _backend, _g
from .registry import BACKENDS, Demonstration, register, source


def wrong_repeat_kv_numpy(x, groups):
    return np.tile(x, (1, groups, 1, 1))  # (B, H, T, d_k): kv heads 0, 1, 2, 0, 1, 2, ..: head h reads h % H_kv


def wrong_repeat_kv_jax(x, groups):
    import jax.numpy as jnp

    return jnp.tile(x, (1, groups, 1, 1))  # (B, H, T, d_k): kv heads 0, 1, 2, 0, 1, 2, ..: head h reads h % H_kv


def wrong_repeat_kv_torch(x, groups):
    return x.repeat(1, groups, 1, 1)  # (B, H, T, d_k): Tensor.repeat tiles (np.tile); np.repeat is repeat_interleave


WRONG_REPEAT_KV = {"numpy": wrong_repeat_kv_numpy, "jax": wrong_repeat_kv_jax, "torch": wrong_repeat_kv_torch}


def wrong_grouped_query_attention(impl, repeat, q, k, v):
    groups = q.shape[1] // k.shape[1]  # query heads per key/value head
    k, v = repeat(k, groups), repeat(v, groups)  # (B, H_kv, T, d_k) -> (B, H, T, d_k) each
    return impl.scaled_dot_product_attention(q, k, v)  # (B, H, T, d_k), weights (B, H, T, T)


def ours_grouped_query_attention(impl, q, k, v):
    groups = q.shape[1] // k.shape[1]  # query heads per key/value head
    k, v = impl.repeat_kv(k, groups), impl.repeat_kv(v, groups)  # head h reads kv head h // groups
    return impl.scaled_dot_product_attention(q, k, v)  # (B, H, T, d_k), weights (B, H, T, T)


def _kv_head_read(context: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> list[int]:
    """Which key/value head each query head of ``context`` (B, H, T, d_k) attended with: the kv head
    whose NumPy attention reproduces that head's output (-1: none)."""
    read = []
    for head in range(q.shape[1]):
        found = -1
        for kv in range(k.shape[1]):
            scores = q[:, head] @ k[:, kv].swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, T, T)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            if np.abs(weights / weights.sum(-1, keepdims=True) @ v[:, kv] - context[:, head]).max() < 1e-12:
                found = kv
        read.append(found)
    return read


@register("gqa-repeat-order", "Grouped-query attention with the key/value heads tiled, not repeated", BACKENDS)
def gqa_repeat_order(backend: str) -> Demonstration:
    """In grouped-query attention H query heads share H_kv key/value heads, and query head h reads kv
    head h // (H / H_kv): the kv heads must be repeated in place (0, 0, 0, 1, 1, 1, ...), as HF's
    repeat_kv, np.repeat and torch.repeat_interleave do. Tiling them (0, 1, 2, 0, 1, 2, ...: np.tile,
    jnp.tile, and torch's Tensor.repeat, whose name says the opposite) pairs most query heads with
    another group's keys and values; nothing fails, and a model loaded from real weights computes
    nonsense. With H_kv = H (multi-head attention) or H_kv = 1 (multi-query) the two orders are the
    same, which is why a test suite of multi-head configurations never sees the bug."""
    b, wrong_repeat = _backend(backend), WRONG_REPEAT_KV[backend]
    config = Config.preset("tiny-llama")  # 9 query heads in 3 groups of 3, d_k 6
    rng = np.random.default_rng(13)
    numbers: dict[str, Any] = {"num_heads": config.num_heads}
    arrays: dict[str, np.ndarray] = {}
    for label, kv_heads in (("gqa", config.num_kv_heads), ("mha", config.num_heads), ("mqa", 1)):
        q = rng.standard_normal((2, config.num_heads, 5, config.d_k))  # (B, H, T, d_k)
        k, v = (rng.standard_normal((2, kv_heads, 5, config.d_k)) for _ in range(2))  # (B, H_kv, T, d_k)
        wrong, _ = wrong_grouped_query_attention(b.impl, wrong_repeat, *map(b.asarray, (q, k, v)))
        ours, _ = ours_grouped_query_attention(b.impl, *map(b.asarray, (q, k, v)))
        wrong, ours = b.to_numpy(wrong), b.to_numpy(ours)  # (B, H, T, d_k)
        numbers[f"{label}_kv_heads"] = kv_heads
        numbers[f"{label}_max_abs_difference"] = float(np.abs(wrong - ours).max())
        if label == "gqa":
            numbers["wrong_kv_head_read"] = _kv_head_read(wrong, q, k, v)
            numbers["ours_kv_head_read"] = _kv_head_read(ours, q, k, v)
            numbers["heads_right_by_chance"] = int((np.abs(wrong - ours).max(axis=(0, 2, 3)) == 0).sum())
            arrays = {"q": q, "k": k, "v": v, "wrong": wrong, "ours": ours}
    return Demonstration(
        pitfall="gqa-repeat-order",
        backend=backend,
        wrong_code=source(wrong_repeat, wrong_grouped_query_attention),
        ours_code=source(ours_grouped_query_attention),
        wrong=(
            f"{config.num_heads} query heads over {config.num_kv_heads} kv heads read kv heads "
            f"{numbers['wrong_kv_head_read']}: output off by up to {_g(numbers['gqa_max_abs_difference'])} "
            f"({numbers['heads_right_by_chance']} heads right by chance); with {config.num_heads} kv heads (MHA) "
            f"off by {_g(numbers['mha_max_abs_difference'])}, with 1 (MQA) by {_g(numbers['mqa_max_abs_difference'])}"
        ),
        ours=f"query heads read kv heads {numbers['ours_kv_head_read']}",
        numbers=numbers,
        arrays=arrays,
    )
