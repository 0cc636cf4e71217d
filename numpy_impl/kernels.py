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

from transformer_spec.checks import check_rows
from transformer_spec.kernels import (
    TILE_KEYS,
    TILED_FROM_KEYS,
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

from .checks import check_mask
from .layers import Linear
from .module import is_grad_enabled, named_submodules
from .positional import rotate_pairs
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
    packed = None
    if cache is not None and query is key and key is value:
        packed = packed_columns((module.w_q, module.w_k, module.w_v))
    if packed is not None:  # a decoding step: one product for q, k and v (decoding_layout)
        d_q, d_kv = module.w_q.weight.shape[1], module.w_k.weight.shape[1]
        qkv = _product(query, *packed)  # (B, T_q, d_q + 2 d_kv)
        q = module.rotary(module.split_heads(qkv[..., :d_q]), position)  # (B, H, T_q, d_k)
        # (B, H_kv, T_q, d_k)
        k = module.rotary(module.split_heads(qkv[..., d_q : d_q + d_kv]), position)
        v = module.split_heads(qkv[..., d_q + d_kv :])  # (B, H_kv, T_q, d_k)
        k, v = cache.update(k, v, position)  # (B, H_kv, T_cache, d_k) each
    else:
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


# --------------------------------------------------------------------- gated_feed_forward
def gated_feed_forward(module, x: np.ndarray) -> np.ndarray:
    """``GatedFeedForward.__call__`` in inference with the gate and up packed (``decoding_layout``):
    one product for both."""
    if is_grad_enabled() or (module.dropout.training and module.dropout.rate > 0):
        return NotImplemented  # the backward needs the written-out path's saved values
    packed = packed_columns((module.w_gate, module.w_up))
    if packed is None:
        return NotImplemented
    module.check_inputs(x)  # as the forward it stands in for
    d_ff = module.w_up.weight.shape[1]
    both = _product(x, *packed)  # (B, T, 2 d_ff)
    hidden = module.activation(both[..., :d_ff])  # (B, T, d_ff)
    hidden *= both[..., d_ff:]  # (B, T, d_ff), in place
    return module.w_down(hidden)  # (B, T, d_model)


KERNELS["gated_feed_forward"] = gated_feed_forward


# ------------------------------------------------------------------------ decoding_layout
def decoding_layout(model) -> None:
    """Packs the Linear layers a decoding step multiplies by one input (each self-attention's q, k
    and v; each gated feed-forward's gate and up) into one [in, sum of outs] matrix each, in
    place: each layer's weight becomes a view of its column block (the same values, shape and
    name), so that one product computes all of them (``packed_columns``). At batch 1 a step is
    one row times each matrix: fewer, larger products read memory faster and cost fewer calls.
    Nothing when fused kernels are off, or already packed."""
    if not fused_kernels_enabled():
        return
    groups = _reading_one_input(model)
    for linears in groups:
        if packed_columns(linears) is None:
            _pack_columns(linears)
    packed = {id(linear) for linears in groups for linear in linears}
    for _, module in named_submodules(model):
        if isinstance(module, Linear) and id(module) not in packed:
            module.weight = _read_fastest(module.weight)
    if getattr(model.config, "tie_output", False):  # read as x @ table.T: (d_model, V), V columns
        model.tgt_embed.token.weight = np.asfortranarray(model.tgt_embed.token.weight)


def _read_fastest(weight: np.ndarray) -> np.ndarray:
    """A [in, out] matrix laid out as OpenBLAS's one-row product reads it fastest (measured by
    ``bench.decode_profile``'s products): row by row ([in, out] in memory) when it has at least
    as many outputs as inputs, column by column ([out, in] in memory: each output one contiguous
    dot product) when fewer, as the feed-forward's down matrix (1.7x faster at SmolLM2's 1536 x
    576). The same values and shape; only the strides."""
    if weight.ndim != 2:
        return weight
    if weight.shape[1] < weight.shape[0]:
        return np.asfortranarray(weight)
    return np.ascontiguousarray(weight)


def _reading_one_input(model) -> list[tuple]:
    """The Linear layers that read one input: each attention's q, k and v (a decoding step's
    self-attention multiplies them by the same rows; cross-attention keeps them apart), each
    gated feed-forward's gate and up."""
    groups = []
    for _, module in named_submodules(model):
        if all(hasattr(module, name) for name in ("w_q", "w_k", "w_v")):
            groups.append((module.w_q, module.w_k, module.w_v))
        if hasattr(module, "w_gate") and hasattr(module, "w_up"):
            groups.append((module.w_gate, module.w_up))
    return groups


def _pack_columns(linears) -> None:
    matrix = np.concatenate([linear.weight for linear in linears], axis=1)  # (in, total)
    biases = None
    if all(linear.bias is not None for linear in linears):
        biases = np.concatenate([linear.bias for linear in linears])  # (total,)
    start = 0
    for linear in linears:
        out = linear.weight.shape[1]
        linear.weight = matrix[:, start : start + out]  # (in, out), a view
        if biases is not None:
            linear.bias = biases[start : start + out]  # (out,), a view
        start += out


def packed_columns(linears) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The [in, sum of outs] matrix (and bias) ``decoding_layout`` made the layers' weights views
    of, if they still are (an optimizer or a load may have given a weight an array of its own
    since: then None, and each layer multiplies on its own)."""
    matrix = _packed_base([linear.weight for linear in linears], axis=1)
    if matrix is None:
        return None
    if any(linear.bias is None for linear in linears):
        return matrix, None
    bias = _packed_base([linear.bias for linear in linears], axis=0)
    return None if bias is None else (matrix, bias)


def _packed_base(parts: list[np.ndarray], axis: int) -> np.ndarray | None:
    """The array the parts are consecutive blocks of along ``axis`` (its last), or None."""
    base = parts[0].base
    if base is None or base.ndim != parts[0].ndim or not base.flags.c_contiguous:
        return None
    if base.shape[axis] != sum(part.shape[axis] for part in parts):
        return None
    address, start = base.__array_interface__["data"][0], 0
    for part in parts:
        at = part.__array_interface__["data"][0]
        if part.base is not base or at != address + start * base.itemsize:
            return None
        start += part.shape[axis]
    return base


def _product(x: np.ndarray, matrix: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x (..., in) @ matrix (in, out) + bias -> (..., out), all positions as one 2-D product."""
    rows = x.reshape(-1, x.shape[-1])  # (N, in)
    y = (rows @ matrix).reshape(*x.shape[:-1], matrix.shape[1])  # (..., out)
    if bias is not None:
        y += bias
    return y


# ---------------------------------------------------------------------------- decode_step
def decode_step(model, tokens, cache, keep, memory_mask, position, project=True):
    """``generate.decode_step`` for a pre-norm decoder-only model in inference, as one function:
    each layer's packed q|k|v and gate|up products (``decoding_layout``), the grouped attention
    above, and no module calls in between. At batch 1 a step is ~30 layers of small operations
    around four matrix-vector products each; the modules' calls, input checks, trace hooks and
    saved values around them cost a third of the products' time (``bench.decode_profile``). The
    tokens and position are checked as the written-out step checks them (the embedding's)."""
    config = model.config
    if config.decoder_has_cross_attention or not config.norm_first or memory_mask is not None:
        return NotImplemented  # an encoder-decoder's step, or post-norm: written out
    layers = model.decoder.layers
    if is_grad_enabled() or (config.dropout > 0 and layers[0].self_attn_dropout.training):
        return NotImplemented  # model.train() sets every dropout's mode: the first one's says
    weights = [_layer_weights(layer) for layer in layers]
    if any(w is None for w in weights):
        return NotImplemented  # not packed (fused kernels were off when the stepper was made)
    from .attention import append_to_cache
    from .generate import make_step_mask

    new = tokens.shape[1]
    keep = append_to_cache(keep, tokens != config.pad_id, position, axis=1)  # (N, T_cache)
    # one query a row and nothing padded: every cached key is allowed, no mask at all
    mask = None if new == 1 and keep.all() else make_step_mask(keep, position, new)
    x = model.tgt_embed(tokens, offset=position)  # (N, T_new, d_model)
    first = layers[0].self_attn
    d_q, d_kv, d_k = first.w_q.weight.shape[1], first.w_k.weight.shape[1], first.d_k
    heads = first.num_heads
    rotary = first.rotary if hasattr(first.rotary, "cos") else None
    if rotary is not None:
        check_rows(position, new, rotary.cos.shape[0])
        cos, sin = rotary.cos[position : position + new], rotary.sin[position : position + new]
    batch = x.shape[0]
    for layer, layer_cache, (qkv_w, qkv_b, ffn_w, ffn_b) in zip(
        layers, cache, weights, strict=True
    ):
        attention, ffn = layer.self_attn, layer.ffn
        qkv = _product(_norm(layer.self_attn_norm, x), qkv_w, qkv_b)  # (N, T_new, d_q + 2 d_kv)
        # q's and k's heads side by side, rotated at once: (N, H + H_kv, T_new, d_k)
        qk = qkv[..., : d_q + d_kv].reshape(batch, new, -1, d_k).transpose(0, 2, 1, 3)
        if rotary is not None:
            qk = rotate_pairs(qk, cos, sin, rotary.layout)
        q, k = qk[:, :heads], qk[:, heads:]  # (N, H, T_new, d_k), (N, H_kv, T_new, d_k)
        v = qkv[..., d_q + d_kv :].reshape(batch, new, -1, d_k).transpose(0, 2, 1, 3)
        k, v = layer_cache.self_attn.update(k, v, position)  # (N, H_kv, T_cache, d_k) each
        context = _grouped_attention(q, k, v, mask)  # (N, H, T_new, d_k)
        context = context.transpose(0, 2, 1, 3).reshape(batch, new, d_q)  # (N, T_new, d_q)
        x = x + _product(context, attention.w_o.weight, attention.w_o.bias)  # (N, T_new, d_model)
        h = _product(_norm(layer.ffn_norm, x), ffn_w, ffn_b)  # (N, T_new, 2 d_ff | d_ff)
        if hasattr(ffn, "w_gate"):
            d_ff = h.shape[-1] // 2
            h, out = ffn.activation(h[..., :d_ff]) * h[..., d_ff:], ffn.w_down  # (N, T_new, d_ff)
        else:
            h, out = ffn.activation(h), ffn.w_2  # (N, T_new, d_ff)
        x = x + _product(h, out.weight, out.bias)  # (N, T_new, d_model)
    if model.decoder.norm is not None:
        x = _norm(model.decoder.norm, x)
    if not project:
        return None, cache, keep
    return model.generator(x, model.tgt_embed.token.weight), cache, keep  # (N, T_new, V)


def _layer_weights(layer) -> tuple | None:
    """(the q|k|v matrix, its bias, the feed-forward's first matrix (gate|up, packed), its bias)
    of a layer the stepper packed; None when its weights are not packed."""
    attention, ffn = layer.self_attn, layer.ffn
    if not all(hasattr(attention, name) for name in ("w_q", "w_k", "w_v")):
        return None  # an attention of another make (one Linear per head): written out
    qkv = packed_columns((attention.w_q, attention.w_k, attention.w_v))
    if hasattr(ffn, "w_gate"):
        first = packed_columns((ffn.w_gate, ffn.w_up))
    else:
        first = ffn.w_1.weight, ffn.w_1.bias
    if qkv is None or first is None:
        return None
    return (*qkv, *first)


def _norm(module, x: np.ndarray) -> np.ndarray:
    """RMSNorm or LayerNorm as their forwards compute it, without what they keep for a backward."""
    if hasattr(module, "bias"):  # LayerNorm
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), biased
        y = (x - mean) / np.sqrt(var + module.eps) * module.weight  # (..., d_model)
        return y if module.bias is None else y + module.bias
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + module.eps)  # (..., 1)
    return x / rms * module.weight  # (..., d_model)


KERNELS["decode_step"] = decode_step
