"""Speed, in one place: the fused kernels JAX runs instead of the written-out math.

The component files show the math; a teaching function or forward with a faster equivalent
carries one marked line, ``@fusable(name)``, and the kernel registered here under that name
runs instead while fused kernels are enabled (``transformer_spec.kernels`` has the switch and
how a call is dispatched). ``shared_tests/components/test_fast_paths.py`` holds every kernel
equal to the code it replaces.

JAX's kernels: one, for long sequences only. Under ``jax.jit`` (how the model runs; see
``model.py``) XLA fuses the written-out math itself: LayerNorm's passes, GELU's, the softmax's
masking, scaling and normalising each become one loop over the data, and the matmuls go to
the same Eigen/oneDNN GEMMs a kernel would call. The fused attention JAX offers,
``jax.nn.dot_product_attention``, computes its softmax in float32 even for float64 inputs (and
averages v over a query row with no allowed key, where we define 0): registering it would
break the float64 parity the suite holds JAX to. The ``@fusable`` lines stay, so that the
three backends read alike and a kernel added here is reached without touching the teaching
code. (The switch is read when a function is traced: a jit-compiled function keeps the path
it was compiled with.)

* ``multi_head_attention``, for a long sequence only (``TILED_FROM_KEYS`` keys or more,
  ``transformer_spec.kernels``; no cache, weights not wanted, no dropout): the tiled attention
  of ``tiled_attention.py`` with its loop over blocks of keys a ``jax.lax.scan``. Under
  ``jax.jit`` the Python loop is unrolled and XLA is free to compute every block's scores
  before it uses any: the compiled program then holds as much as the plain attention's
  (measured: 1 GiB of temporaries for both at 8 heads and 4096 keys, float32). A scan runs
  one block at a time (145 MiB there, and faster), and ``jax.checkpoint`` on its step makes
  the backward pass recompute each block's weights instead of keeping them all, as
  FlashAttention's backward does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

from transformer_spec.kernels import (
    TILE_KEYS,
    TILED_FROM_KEYS,
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

__all__ = ["KERNELS", "fusable", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

KERNELS: dict[str, Callable] = {}  # name -> kernel, filled below
fusable = fusable_in(KERNELS)  # the decorator of the marked lines: @fusable("gelu")


# ------------------------------------------------------------------- multi_head_attention
def multi_head_attention(
    module, query, key, value, mask=None, need_weights=False, cache=None, position=0
):
    """``MultiHeadAttention.__call__`` for a long sequence: the keys and values in blocks, one
    ``lax.scan`` step each."""
    dropout = module.dropout
    if need_weights or cache is not None or (not dropout.deterministic and dropout.rate > 0):
        return NotImplemented  # the weights are wanted, a decoding step, or dropped out
    if key is None or key.shape[1] < TILED_FROM_KEYS:
        return NotImplemented  # the whole scores fit: the written-out attention
    module.check_inputs(query, key, value, mask, cache, position)  # as the forward it stands in for
    q = module.rotary(module.split_heads(module.w_q(query)), position)  # (B, H, T_q, d_k)
    k, v = module.key_value(key, value, cache, position)  # (B, H_kv, T_k, d_k) each
    if module.groups > 1:  # grouped-query attention: query head h reads kv head h // groups
        k, v = jnp.repeat(k, module.groups, axis=1), jnp.repeat(v, module.groups, axis=1)
    context = scanned_attention(q, k, v, mask, TILE_KEYS)  # (B, H, T_q, d_k)
    return module.w_o(module.merge_heads(context)), None  # (B, T_q, d_model)


# compiled once per shape, also when called outside jax.jit (op by op, each call would trace and
# compile its scan again); inside a compiled model it is part of the model's program
@functools.partial(jax.jit, static_argnames="block_size")
def scanned_attention(q: Array, k: Array, v: Array, mask: Array | None, block_size: int) -> Array:
    """``tiled_attention``'s context (tiled_attention.py), the loop over blocks of keys a
    ``lax.scan``: q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v), mask broadcastable to
    (..., T_q, T_k) or None -> (..., T_q, d_v). The keys are padded to whole blocks, the padding
    masked out."""
    t_k = k.shape[-2]
    blocks = -(-t_k // block_size)  # ceil(T_k / block_size)
    pad = blocks * block_size - t_k
    if mask is None:
        mask = jnp.ones((1,) * (q.ndim - 1) + (t_k,), bool)  # (1, .., 1, T_k)
    mask = jnp.broadcast_to(mask, (*mask.shape[:-1], t_k))  # (..., T_q|1, T_k)

    def split(x: Array, keys_axis: int) -> Array:
        """(..., T_k, ...) -> (blocks, ..., block_size, ...), padded with zeros (False)."""
        axis = keys_axis % x.ndim
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths)  # (..., blocks * block_size, ...)
        shape = [*x.shape[:axis], blocks, block_size, *x.shape[axis + 1 :]]
        return jnp.moveaxis(x.reshape(shape), axis, 0)  # (blocks, ..., block_size, ...)

    scale = math.sqrt(q.shape[-1])

    @jax.checkpoint  # the backward recomputes a block's weights instead of keeping them
    def step(carry, block):
        row_max, row_sum, context = carry  # (..., T_q, 1), (..., T_q, 1), (..., T_q, d_v)
        k_block, v_block, allowed = block  # (..., T_b, d_k), (..., T_b, d_v), (..., T_q|1, T_b)
        scores = q @ k_block.swapaxes(-1, -2) / scale  # (..., T_q, T_b)
        scores = jnp.where(allowed, scores, -math.inf)  # (..., T_q, T_b)
        new_max = jnp.maximum(row_max, scores.max(axis=-1, keepdims=True))  # (..., T_q, 1)
        shift = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # (..., T_q, 1)
        exp = jnp.exp(scores - shift)  # (..., T_q, T_b)
        correction = jnp.exp(row_max - shift)  # (..., T_q, 1)
        row_sum = correction * row_sum + exp.sum(axis=-1, keepdims=True)  # (..., T_q, 1)
        context = correction * context + exp @ v_block  # (..., T_q, d_v)
        return (new_max, row_sum, context), None

    start = (
        jnp.full_like(q[..., :1], -math.inf),  # (..., T_q, 1): the running max
        jnp.zeros_like(q[..., :1]),  # (..., T_q, 1): the running sum
        jnp.zeros((*q.shape[:-1], v.shape[-1]), q.dtype),  # (..., T_q, d_v)
    )
    blocks_of = (split(k, -2), split(v, -2), split(mask, -1))
    (_, row_sum, context), _ = jax.lax.scan(step, start, blocks_of)
    return context / jnp.where(row_sum > 0, row_sum, 1.0)  # (..., T_q, d_v); 0 for an empty row


KERNELS["multi_head_attention"] = multi_head_attention
