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

import contextlib
import functools
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
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


# ----------------------------------------------------------------------------- decoding
# Weights packed for decoding, per model: (the arrays they were made from, the packed ones).
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoding_weights(model) -> tuple | None:
    """Per decoder layer, (the q|k|v matrix [in, d_q + 2 d_kv], its bias or None, the
    feed-forward's first matrix (gate|up [in, 2 d_ff], or w_1), its bias or None), for the
    cached stepper of a pre-norm decoder-only model with fused kernels on; else None.

    At batch 1 a decoding step is one row times each matrix, and XLA runs each product as its own
    call: one product for q, k and v and one for the gate and up read memory faster and make 90
    of SmolLM2's 210 calls a step unnecessary. JAX's arrays cannot be views of one another, so
    the packed matrices are copies (for SmolLM2-135M 278 MB beside its 538 MB), made once per
    model and kept while its arrays are the ones they were made from (``_PACKED``)."""
    config = model.config
    if not fused_kernels_enabled() or config.decoder_has_cross_attention or not config.norm_first:
        return None
    layers = model.decoder.layers
    sources, groups = [], []
    for layer in layers:
        attention, ffn = layer.self_attn, layer.ffn
        if not all(hasattr(attention, name) for name in ("w_q", "w_k", "w_v")):
            return None  # an attention of another make (one Linear per head): written out
        linears = [attention.w_q, attention.w_k, attention.w_v]
        linears += [ffn.w_gate, ffn.w_up] if hasattr(ffn, "w_gate") else [ffn.w_1]
        groups.append(linears)
        sources += [linear.kernel[...] for linear in linears]
        sources += [linear.bias[...] for linear in linears if linear.bias is not None]
    sources.append(model.tgt_embed.token.weight[...])
    kept = _PACKED.get(model)
    if kept is not None and len(kept[0]) == len(sources):
        if all(a is b for a, b in zip(kept[0], sources, strict=True)):
            return kept[1]
    packed = tuple((*_pack(linears[:3]), *_pack(linears[3:])) for linears in groups)
    # a tied output projection reads the token table as its transpose, (d_model, V): XLA makes that
    # product a loop of its own over the (V, d_model) table (8 ms a step for SmolLM2's 113 MB), and
    # a matrix-vector kernel over a [d_model, V] copy (3.6 ms)
    output = jnp.asarray(model.tgt_embed.token.weight[...].T.copy()) if config.tie_output else None
    packed = (packed, output)
    _PACKED[model] = (sources, packed)
    return packed


def _pack(linears) -> tuple[Array, Array | None]:
    """Linear layers reading one input -> their kernels side by side [in, sum of outs], and
    their biases."""
    if len(linears) == 1:
        bias = linears[0].bias
        return linears[0].kernel[...], None if bias is None else bias[...]
    matrix = jnp.concatenate([linear.kernel[...] for linear in linears], axis=1)  # (in, total)
    if any(linear.bias is None for linear in linears):
        return matrix, None
    return matrix, jnp.concatenate([linear.bias[...] for linear in linears])  # (total,)


_tracing = threading.local()  # ``packed``: the packed weights of the step being traced, or None


@contextlib.contextmanager
def decoding_with(packed: tuple | None):
    """While a cached step is traced: the packed weights (``decoding_weights``, passed to the
    compiled step as arguments) that its kernel multiplies by; None: the written-out step."""
    previous = getattr(_tracing, "packed", None)
    _tracing.packed = packed
    try:
        yield
    finally:
        _tracing.packed = previous


def decode_step(model, tokens, cache, keep, memory_mask, position, project=True):
    """``generate.decode_step`` with ``decoding_weights``' packed products (traced under
    ``jax.jit`` with the rest of the step: everything else is the layers' own code, fused by
    XLA)."""
    packed = getattr(_tracing, "packed", None)
    if packed is None or memory_mask is not None:
        return NotImplemented  # no packed weights were handed to this step
    packed, output = packed
    from .attention import append_to_cache, repeat_kv, scaled_dot_product_attention
    from .generate import make_step_mask

    config = model.config
    new = tokens.shape[1]
    keep = append_to_cache(keep, tokens != config.pad_id, position, axis=1)  # (N, T_cache)
    mask = make_step_mask(keep, position, new)  # (N, 1, T_new, T_cache)
    x = model.tgt_embed(tokens, offset=position)  # (N, T_new, d_model)
    for layer, layer_cache, (qkv_w, qkv_b, ffn_w, ffn_b) in zip(
        model.decoder.layers, cache, packed, strict=True
    ):
        attention, ffn = layer.self_attn, layer.ffn
        d_q, d_kv = attention.w_q.kernel.shape[1], attention.w_k.kernel.shape[1]
        qkv = _product(layer.self_attn_norm(x), qkv_w, qkv_b)  # (N, T_new, d_q + 2 d_kv)
        q = attention.rotary(attention.split_heads(qkv[..., :d_q]), position)  # (N, H, T_new, d_k)
        k = attention.rotary(attention.split_heads(qkv[..., d_q : d_q + d_kv]), position)
        v = attention.split_heads(qkv[..., d_q + d_kv :])  # (N, H_kv, T_new, d_k)
        k, v = layer_cache.self_attn.update(k, v, position)  # (N, H_kv, T_cache, d_k) each
        # (N, H, T_cache, d_k) each
        k, v = repeat_kv(k, attention.groups), repeat_kv(v, attention.groups)
        context, _ = scaled_dot_product_attention(q, k, v, mask, attention.dropout)
        x = x + attention.w_o(attention.merge_heads(context))  # (N, T_new, d_model)
        h = _product(layer.ffn_norm(x), ffn_w, ffn_b)  # (N, T_new, 2 d_ff | d_ff)
        if hasattr(ffn, "w_gate"):
            d_ff = h.shape[-1] // 2
            h, out = ffn.activation(h[..., :d_ff]) * h[..., d_ff:], ffn.w_down  # (N, T_new, d_ff)
        else:
            h, out = ffn.activation(h), ffn.w_2  # (N, T_new, d_ff)
        x = x + out(h)  # (N, T_new, d_model)
    if model.decoder.norm is not None:
        x = model.decoder.norm(x)
    if not project:
        return None, cache, keep
    if output is None:
        return model.generator(x, model.tgt_embed.token.weight[...]), cache, keep  # (N, T_new, V)
    logits = x @ output  # (N, T_new, d_model) @ (d_model, V) -> (N, T_new, V)
    bias = model.generator.logits_bias
    return (logits if bias is None else logits + bias[...]), cache, keep


def _product(x: Array, matrix: Array, bias: Array | None) -> Array:
    y = x @ matrix  # (..., in) @ (in, out) -> (..., out)
    return y if bias is None else y + bias


KERNELS["decode_step"] = decode_step


# ------------------------------------------------------------- the compiled decoding step
def _split_decode_step(structure, arrays, packed, *args, project=True):
    """``decode_step`` of the model that ``nnx.split`` and ``jax.tree.flatten`` took apart into a
    static ``structure`` (graph and tree definitions) and its flat list of ``arrays``; with the
    weights ``decoding_weights`` packed, its kernel (None: the written-out step)."""
    from .generate import decode_step  # the written-out step, or its kernel above

    graphdef, treedef = structure.value
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, arrays))
    with decoding_with(packed):  # what the kernel multiplies by
        return decode_step(model, *args, project=project)


# The steps of one generation: the model split once, at ``start``. Handing jax.jit the module
# itself makes it flatten the module's graph in Python at every call (574 arrays for
# SmolLM2-135M: 8 ms a step, a sixth of the step); a flat list of arrays is read in C++.
compiled_decode_step = jax.jit(_split_decode_step, static_argnums=0, static_argnames="project")


class _Structure:
    """A model's static structure (graph and tree definitions) as jax.jit's static argument, hashed
    once: jax.jit hashes a static argument at every call, and an NNX GraphDef hashes its whole
    graph in Python (7 ms a step for SmolLM2-135M). Equal structures are one object
    (``_STRUCTURES``), so the compiled step's cache finds it by identity."""

    def __init__(self, value: tuple):
        self.value, self.hash = value, hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Structure) and self.value == other.value)


_STRUCTURES: dict[_Structure, _Structure] = {}  # each structure seen, once


def split_model(model: Any) -> tuple[_Structure, list, tuple | None]:
    """-> (the model's static structure, its arrays, its packed decoding weights or None): what
    ``compiled_decode_step`` takes first."""
    graphdef, state = nnx.split(model)
    arrays, treedef = jax.tree.flatten(state)
    structure = _Structure((graphdef, treedef))
    structure = _STRUCTURES.setdefault(structure, structure)
    return structure, arrays, decoding_weights(model)
