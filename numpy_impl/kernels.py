"""Speed, in one place: the fused kernels NumPy runs instead of the written-out math.

The component files show the math; a teaching function or forward with a faster equivalent
carries one marked line, ``@fusable(name)``, and the kernel registered here under that name
runs instead while fused kernels are enabled (``transformer_spec.kernels`` has the switch and
how a call is dispatched). ``shared_tests/components/test_fast_paths.py`` holds every kernel
equal to the code it replaces.

NumPy's kernels:

* ``gelu``: in float32, erf by a rational approximation (that of Eigen and XLA, within
  5e-7 of the exact one), the whole GELU block by block so that its dozen passes stay in
  the CPU's cache and no temporary is as large as the input; ``scipy.special.erf`` runs a
  scalar loop (~15 ns an element, most of a BERT forward's GELU time). float64 keeps the
  exact erf.
* ``multi_head_attention``: in inference, the attention one (batch entry) at a time, so
  that the (B, H, T_q, T_k) scores and weights are never all in memory at once (one
  (H, T_q, T_k) block is), and the softmax works in place on that block.
  A decoding step (with a key/value cache): grouped-query heads read the cache
  in place. The written-out step repeats each cached key/value head for the query heads
  that share it (``repeat_kv``: a copy of the whole cache, per layer and step) and then
  multiplies (B, H) small matrices; here the ``groups`` query heads of one key/value head
  are the rows of one block, (groups * T_q, d_k) against that head's (T_k, d_k) keys: no
  copy, and H / H_kv times fewer, taller products. The softmax works in place.
  A long sequence (``TILED_FROM_KEYS`` keys or more, ``transformer_spec.kernels``): the
  tiled attention (``tiled_attention.py``), ``TILE_KEYS`` keys at a time, so that not even
  one batch entry's (H, T_q, T_k) scores are made: one (B, H, T_q, TILE_KEYS) block is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from transformer_spec.kernels import (
    TILE_KEYS,
    TILED_FROM_KEYS,
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

from .checks import check_mask
from .module import is_grad_enabled
from .tiled_attention import tiled_attention

__all__ = ["KERNELS", "fusable", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

KERNELS: dict[str, Callable] = {}  # name -> kernel, filled below
fusable = fusable_in(KERNELS)  # the decorator of the marked lines: @fusable("gelu")


# ----------------------------------------------------------------------------------- gelu
# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (outside it erf is +-1 to float32 precision).
# Coefficients from the highest power down, as np.polyval takes them.
_ERF_P = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                   -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                   -1.60960333262415e-02], np.float32)  # fmt: skip
_ERF_Q = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02], np.float32)  # fmt: skip
_BLOCK = 1 << 16  # elements per block: 256 KiB of float32, which stays in the CPU's cache


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)) in float32, block by block: each block's dozen passes read
    the cache, not memory, and no temporary is as large as x (only the output is)."""
    if x.dtype != np.float32:
        return NotImplemented  # float64: the exact erf, for the parity tests
    flat, out = x.reshape(-1), np.empty(x.size, x.dtype)  # (N,) each
    for start in range(0, x.size, _BLOCK):
        block = flat[start : start + _BLOCK]  # (block,)
        z = np.clip(block / math.sqrt(2.0), -4.0, 4.0)  # (block,)
        z2 = z * z  # (block,)
        erf = z * np.polyval(_ERF_P, z2) / np.polyval(_ERF_Q, z2)  # (block,)
        out[start : start + _BLOCK] = 0.5 * block * (1.0 + erf)  # (block,)
    return out.reshape(x.shape)


KERNELS["gelu"] = gelu


# ------------------------------------------------------------------- multi_head_attention
def multi_head_attention(
    module, query, key, value, mask=None, need_weights=False, cache=None, position=0
):
    """``MultiHeadAttention.__call__`` one batch entry at a time, softmax in place; a decoding step
    (with a cache) with the query heads of each key/value head as one block."""
    if need_weights or is_grad_enabled() or (module.dropout.training and module.dropout.rate > 0):
        return NotImplemented  # the weights are wanted, kept for the backward, or dropped out
    module.check_inputs(query, key, value, mask, cache, position)  # as the forward it stands in for
    q = module.rotary(module.split_heads(module.w_q(query)), position)  # (B, H, T_q, d_k)
    k, v = module.key_value(key, value, cache, position)  # (B, H_kv, T_k, d_k) each
    if cache is not None:  # the scores span the cache: checked here, as in torch's kernel
        check_mask("mask", mask, (*q.shape[:-1], k.shape[-2]))
    if cache is not None and (mask is None or mask.shape[1] == 1):  # one mask for every head
        context = _grouped_attention(q, k, v, mask)  # (B, H, T_q, d_k)
        return module.w_o(module.merge_heads(context)), None  # (B, T_q, d_model)
    groups = module.groups
    if groups > 1:  # grouped-query attention: query head h reads kv head h // groups
        k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)  # (B, H, T_k, d_k) each
    if k.shape[-2] >= TILED_FROM_KEYS:  # a long sequence: a block of keys at a time
        context, _ = tiled_attention(q, k, v, mask, TILE_KEYS)  # (B, H, T_q, d_k)
        return module.w_o(module.merge_heads(context)), None  # (B, T_q, d_model)
    context = np.empty_like(q)  # (B, H, T_q, d_k)
    scale = math.sqrt(q.shape[-1])
    for b in range(q.shape[0]):
        scores = q[b] @ k[b].swapaxes(-1, -2)  # (H, T_q, d_k) @ (H, d_k, T_k) -> (H, T_q, T_k)
        scores /= scale
        if mask is not None:
            mask_b = mask[b if mask.shape[0] > 1 else 0]  # (H|1, T_q|1, T_k)
            allowed = np.broadcast_to(mask_b, scores.shape)  # (H, T_q, T_k)
            np.putmask(scores, ~allowed, -np.inf)
        row_max = scores.max(axis=-1, keepdims=True)  # (H, T_q, 1); -inf where nothing is allowed
        row_max[~np.isfinite(row_max)] = 0.0
        scores -= row_max
        np.exp(scores, out=scores)  # (H, T_q, T_k), 0 at masked keys
        total = scores.sum(axis=-1, keepdims=True)  # (H, T_q, 1)
        total[total == 0] = 1.0  # a row with no allowed key: weights 0, output 0
        scores /= total  # the weights
        context[b] = scores @ v[b]  # (H, T_q, T_k) @ (H, T_k, d_k) -> (H, T_q, d_k)
    return module.w_o(module.merge_heads(context)), None  # (B, T_q, d_model)


def _grouped_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None
) -> np.ndarray:
    """q (B, H, T_q, d_k) over k and v (B, H_kv, T_k, d_k), mask (B|1, 1, T_q|1, T_k) or None ->
    context (B, H, T_q, d_k), the cache read in place: no repeated copy of it."""
    batch, heads, t_q, d_k = q.shape
    kv_heads, t_k = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    # query head h = j * groups + g reads key/value head j: (H, T_q) -> (H_kv, groups * T_q)
    # is a reshape
    grouped = q.reshape(batch, kv_heads, groups * t_q, d_k)  # (B, H_kv, groups * T_q, d_k)
    scores = grouped @ k.swapaxes(-1, -2)  # (B, H_kv, groups * T_q, d_k) @ (B, H_kv, d_k, T_k)
    scores /= math.sqrt(d_k)  # (B, H_kv, groups * T_q, T_k)
    if mask is not None:  # (B|1, 1, T_q|1, T_k) -> the same rows for every query head of a group
        # (B|1, 1, groups, T_q, T_k)
        rows = np.broadcast_to(mask[:, :, None], (mask.shape[0], 1, groups, t_q, t_k))
        rows = rows.reshape(mask.shape[0], 1, groups * t_q, t_k)  # (B|1, 1, groups * T_q, T_k)
        # scores (B, H_kv, groups * T_q, T_k): -inf at the keys not allowed
        np.putmask(scores, ~np.broadcast_to(rows, scores.shape), -np.inf)
    # -inf where nothing is allowed
    row_max = scores.max(axis=-1, keepdims=True)  # (B, H_kv, groups * T_q, 1)
    row_max[~np.isfinite(row_max)] = 0.0
    scores -= row_max
    np.exp(scores, out=scores)  # 0 at masked keys
    total = scores.sum(axis=-1, keepdims=True)  # (B, H_kv, groups * T_q, 1)
    total[total == 0] = 1.0  # a row with no allowed key: weights 0, output 0
    scores /= total  # the weights
    # (B, H_kv, groups * T_q, T_k) @ (B, H_kv, T_k, d_k) -> (B, H_kv, groups * T_q, d_k)
    context = scores @ v
    return context.reshape(batch, heads, t_q, d_k)  # (B, H, T_q, d_k)


KERNELS["multi_head_attention"] = multi_head_attention
