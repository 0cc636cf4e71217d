"""Scaled dot-product attention and multi-head attention (paper, section 3.2).

Written out as the paper writes it. The frameworks' fused attention is not quite the same
function: ``jax.nn.dot_product_attention`` computes the softmax in float32 even for float64
inputs, and the libraries give a query row with no allowed key NaN or the mean of V where we
define zeros. torch's ``F.scaled_dot_product_attention`` runs only as a fused kernel
(kernels.py), held equal to this code.
"""

from __future__ import annotations

import math

import numpy as np
from numpy import ndarray as Array

from transformer_spec import Config
from transformer_spec.checks import (
    check_attention_inputs,
    check_attention_projections,
    check_cache_holds_keys,
    check_rows,
)
from transformer_spec.trace import record

from .checks import check_float_inputs, check_mask
from .kernels import fusable
from .layers import Dropout, Linear
from .module import Module, with_prefix
from .positional import Position, RotaryEmbedding


def masked_softmax(scores: Array, mask: Array | None) -> Array:
    """Softmax over the last axis, over allowed keys only.

    Masked scores become -inf, so their weight is exp(-inf) = 0 *exactly* (a finite
    fill such as -1e9 leaves them a tiny weight, and gives a fully masked row uniform
    weights over padding). A row with no allowed key would then be exp(-inf - -inf) =
    NaN (``torch.softmax`` returns NaN there); we define it as all-zero weights instead,
    in every backend.

    The order of operations also keeps *gradients* finite (for torch's and JAX's autograd):
    ``where`` picks, it does not compute, so the -inf branch and the replaced row max pass
    back zero gradient, and exp(-inf) = 0 has derivative 0. (``jax.nn.softmax`` with its
    ``where=`` argument gets the forward pass right but is not this algorithm.)
    """
    if mask is not None:
        scores = np.where(mask, scores, -math.inf)  # (..., T_q, T_k)
    row_max = scores.max(axis=-1, keepdims=True)  # (..., T_q, 1); -inf where nothing is allowed
    # subtracting the row max avoids overflow; a row with nothing allowed subtracts 0
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # (..., T_q, 1)
    exp = np.exp(scores - row_max)  # (..., T_q, T_k), exactly 0 at masked keys
    total = exp.sum(axis=-1, keepdims=True)  # (..., T_q, 1)
    # an empty row divides by 1: 0 / 1 = 0, not 0 / 0
    return exp / np.where(total > 0, total, 1.0)  # (..., T_q, T_k)


def masked_softmax_backward(weights: Array, grad_weights: Array) -> Array:
    """Gradient with respect to the (unmasked) scores, from the softmax's output ``weights``.

    For w = softmax(s) over a row: ds_j = w_j (dw_j - sum_i dw_i w_i). Masked keys have
    w_j = 0 exactly, so they get 0 (their score was replaced by a constant -inf), and a
    fully masked row (all w = 0, a constant output) gets 0 everywhere: never NaN.
    """
    inner = (grad_weights * weights).sum(axis=-1, keepdims=True)  # (..., T_q, 1)
    return weights * (grad_weights - inner)  # (..., T_q, T_k)


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None = None,
    dropout: Dropout | None = None,
) -> tuple[Array, Array]:
    """softmax(q k^T / sqrt(d_k)) v -> (context (..., T_q, d_v), weights (..., T_q, T_k)).

    Dividing by sqrt(d_k) keeps the scores' variance near 1 when q and k have unit
    variance entries, so the softmax does not saturate (section 3.2.1). It is d_k, the
    per-head size, not d_model.

    ``dropout`` (active in training mode only) drops whole query-key links from the
    weights before they average v; the returned weights are the softmax's, before it.
    """
    check_attention_inputs(q.shape, k.shape, v.shape)
    check_float_inputs(("q", "k", "v"), (q, k, v))
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (..., T_q, d_k) @ (..., d_k, T_k)
    check_mask("mask", mask, scores.shape)
    record(None, scores=scores)  # traced under the calling module's name
    weights = masked_softmax(scores, mask)  # (..., T_q, T_k)
    record(None, weights=weights)
    used = weights if dropout is None else dropout(weights)  # (..., T_q, T_k)
    context = used @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    record(None, context=context)
    return context, weights


def scaled_dot_product_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    weights: Array,
    grad_context: Array,
    dropout: Dropout | None = None,
) -> tuple[Array, Array, Array]:
    """grad_context (..., T_q, d_v) -> grad_q (..., T_q, d_k), grad_k, grad_v (..., T_k, d_k|d_v).

    ``weights`` is the forward's output (..., T_q, T_k): the mask is already in it (0 at
    masked keys), so the backward needs no mask. ``dropout`` is the module the forward
    used: it kept its multiplier.
    """
    scale = math.sqrt(q.shape[-1])
    multiplier = None if dropout is None else dropout.saved.multiplier  # (..., T_q, T_k) or None
    # context = used @ v, used = weights * multiplier (or the weights themselves)
    used = weights if multiplier is None else weights * multiplier  # (..., T_q, T_k)
    grad_used = grad_context @ v.swapaxes(-1, -2)  # (T_q, d_v) @ (d_v, T_k) -> (..., T_q, T_k)
    grad_v = used.swapaxes(-1, -2) @ grad_context  # (T_k, T_q) @ (T_q, d_v) -> (..., T_k, d_v)
    # used = dropout(weights); grad_weights (..., T_q, T_k)
    grad_weights = grad_used if dropout is None else dropout.backward(grad_used)[0]
    # weights = masked_softmax(scores)
    grad_scores = masked_softmax_backward(weights, grad_weights)  # (..., T_q, T_k)
    # scores = q @ k^T / sqrt(d_k)
    grad_q = grad_scores @ k / scale  # (T_q, T_k) @ (T_k, d_k) -> (..., T_q, d_k)
    grad_k = grad_scores.swapaxes(-1, -2) @ q / scale  # (T_k, T_q) @ (T_q, d_k) -> (..., T_k, d_k)
    return grad_q, grad_k, grad_v


def repeat_kv(x: Array, groups: int) -> Array:
    """Grouped-query attention: x (B, H_kv, T, d_k) -> (B, H_kv * groups, T, d_k), each key/value
    head repeated for the ``groups`` query heads that share it: query head h reads kv head
    h // groups (HF's ``repeat_kv``). Tiling instead (h % H_kv) runs and gives nonsense with
    real weights: the order is part of the model."""
    if groups == 1:
        return x  # multi-head attention: one kv head per query head
    return np.repeat(x, groups, axis=1)  # (B, H, T, d_k): kv heads 0, 0, .., 1, 1, ..


def repeat_kv_backward(grad_output: Array, groups: int) -> Array:
    """grad_output (B, H, T, d_k) -> (B, H_kv, T, d_k): a kv head read by ``groups`` query heads
    gets the sum of their gradients."""
    batch, heads, seq_len, d_k = grad_output.shape
    # (B, H, T, d_k) -> (B, H_kv, groups, T, d_k)
    grouped = grad_output.reshape(batch, heads // groups, groups, seq_len, d_k)
    return grouped.sum(axis=2)  # (B, H_kv, T, d_k)


class KeyValueCache:
    """One attention layer's keys and values while decoding, already projected and split into
    heads, so that a step projects only its new tokens (``MultiHeadAttention.__call__`` with
    ``cache=``). ``update`` writes a step's new keys and values in, as Hugging Face's caches do:
    the cache changes in place (under ``jax.jit`` a cache is a pytree argument, so the compiled
    step changes its own copy and returns it: the caller keeps the one it gets back)."""

    def __init__(self, k: Array, v: Array):
        self.k = k  # (B, H_kv, T_cache, d_k): the key/value heads only, not repeated
        self.v = v  # (B, H_kv, T_cache, d_k)

    def update(self, k: Array | None, v: Array | None, position: Position) -> tuple[Array, Array]:
        """The keys and values (B, H_kv, T_new, d_k) of positions position .. position + T_new - 1
        -> those of every position so far, the new ones kept for the next step. None: nothing
        new (cross-attention: the cache holds the memory's, projected once, before the first
        step)."""
        if k is not None:
            self.k = append_to_cache(self.k, k, position, axis=2)  # (B, H_kv, T_cache, d_k)
            self.v = append_to_cache(self.v, v, position, axis=2)  # (B, H_kv, T_cache, d_k)
        return self.k, self.v


def append_to_cache(cached: Array, new: Array, position: int, axis: int) -> Array:
    """``cached`` holds positions 0 .. position - 1 along ``axis``; -> it with ``new`` after them.

    NumPy and torch grow the array by concatenation: a copy of everything cached so far, and
    a shape that changes every step (fine without a compiler). ``jax.jit`` compiles once per
    shape, so JAX's cache is a buffer of fixed size (``config.max_len`` positions, see
    ``empty_cache``) and a step writes its entries at ``position``, which may be traced: one
    compiled step serves every position. The price: each step attends over all the slots
    (those not written yet are masked out: the causal mask already hides every position after
    the query's). ``dynamic_update_slice`` clamps a start past the end instead of raising, so
    JAX's caller checks the position eagerly.
    """
    if cached.shape[axis] != position:
        raise ValueError(
            f"the cache holds {cached.shape[axis]} positions, "
            f"but the new entries are for position {position}"
        )
    return np.concatenate([cached, new], axis=axis)  # (..., position + T_new, ...)


class NoRotation(Module):
    """The queries and keys as they are: the attention of a model without rotary positions (the
    paper's sinusoids and BERT's learned positions are added to the embeddings instead), and
    every cross-attention (positions mean something only within one sequence)."""

    def __call__(self, x: Array, offset: Position = 0) -> Array:
        return x  # (B, H, T, d_k)

    def backward(self, grad_output: Array) -> tuple[Array, dict]:
        return grad_output, {}  # (B, H, T, d_k)


class MultiHeadAttention(Module):
    """h heads in one set of matrices: project, split into heads, attend, merge, project.

    With ``config.num_kv_heads`` < num_heads (grouped-query attention) the keys and values
    have fewer heads, each shared by a group of query heads; with ``rotary`` (the self-
    attention of a model with ``positional="rotary"``; ``rotary=False`` for cross-attention)
    queries and keys are rotated by their positions after the split.
    """

    schema = "attention"

    def __init__(self, config: Config, dtype: str = "float32", rotary: bool | None = None):
        super().__init__()
        self.config = config
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.d_k = config.d_k
        self.groups = config.num_heads // config.num_kv_heads  # query heads per key/value head
        d_q, d_kv = config.num_heads * config.d_k, config.num_kv_heads * config.d_k
        bias = config.attention_bias
        self.w_q = Linear(config.d_model, d_q, bias, dtype)
        self.w_k = Linear(config.d_model, d_kv, bias, dtype)
        self.w_v = Linear(config.d_model, d_kv, bias, dtype)
        self.w_o = Linear(d_q, config.d_model, bias, dtype)
        if rotary is None:
            rotary = config.positional == "rotary"
        self.rotary = RotaryEmbedding(config, dtype) if rotary else NoRotation()
        self.dropout = Dropout(config.dropout)  # on the attention weights

    def split_heads(self, x: Array) -> Array:
        batch, seq_len, _ = x.shape
        # H query heads, or H_kv key/value heads
        x = x.reshape(batch, seq_len, -1, self.d_k)  # (B, T, H, d_k)
        return x.swapaxes(1, 2)  # (B, H, T, d_k)

    def merge_heads(self, x: Array) -> Array:
        batch, _, seq_len, _ = x.shape
        x = x.swapaxes(1, 2)  # (B, T, H, d_k)
        return x.reshape(batch, seq_len, -1)  # (B, T, H * d_k)

    def check_inputs(
        self,
        query: Array,
        key: Array | None,
        value: Array | None,
        mask: Array | None = None,
        cache: KeyValueCache | None = None,
        position: Position = 0,
    ) -> None:
        """query (B, T_q, d_model), key and value (B, T_k, d_model) in the weights' dtype (None: a
        cache holds them), mask broadcastable to the scores (B, H, T_q, T_k), which span the cache
        too when there is one; checked here, before a fused kernel may take the call."""
        if key is None or value is None:
            check_cache_holds_keys(key, value, cache is not None)
            key = value = query[:, :0]  # (B, 0, d_model): no new keys and values
        check_attention_projections(query.shape, key.shape, value.shape, self.config.d_model)
        check_float_inputs(("query", "key", "value"), (query, key, value), self)
        if cache is None:  # else the scores' length is the cache's: checked where they are made
            check_mask("mask", mask, (query.shape[0], self.num_heads, query.shape[1], key.shape[1]))
        if isinstance(self.rotary, RotaryEmbedding):  # its table has rows for these positions
            check_rows(position, max(query.shape[1], key.shape[1]), self.config.max_len)

    @fusable("multi_head_attention")  # speed: a fused kernel may run instead (kernels.py)
    def __call__(
        self,
        query: Array,
        key: Array | None,
        value: Array | None,
        mask: Array | None = None,
        need_weights: bool = False,
        cache: KeyValueCache | None = None,
        position: Position = 0,
    ) -> tuple[Array, Array | None]:
        """query (B, T_q, d_model), key and value (B, T_k, d_model) -> output (B, T_q, d_model),
        and the attention weights (B, H, T_q, T_k) when ``need_weights``.

        Decoding passes the layer's ``cache`` and the ``position`` of the first new token: the new
        keys and values join those of every earlier position, and the queries attend over all."""
        self.check_inputs(query, key, value, mask, cache, position)  # refused with a message
        q = self.rotary(self.split_heads(self.w_q(query)), position)  # (B, H, T_q, d_k)
        k, v = self.key_value(key, value, cache, position)  # (B, H_kv, T_k, d_k) each
        record(self, q=q, k=k, v=v)
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # (B, H, T_k, d_k) each
        # (B, H, T_q, d_k), (B, H, T_q, T_k)
        context, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout)
        self.keep(q=q, k=k, v=v, weights=weights)  # differs: numpy-autograd
        output = self.w_o(self.merge_heads(context))  # (B, T_q, d_model)
        record(self, output=output)
        return output, (weights if need_weights else None)

    def backward(
        self, grad_output: Array
    ) -> tuple[tuple[Array, Array, Array], dict[str, Array]]:
        """grad_output (B, T_q, d_model) -> (grad_query, grad_key, grad_value), grads of w_q,
        w_k, w_v, w_o.

        Only the output is differentiated: the returned attention weights are a read-out."""
        q, k, v = self.saved.q, self.saved.k, self.saved.v  # (B, H, T_q, d_k), (B, H, T_k, d_k) x2
        weights = self.saved.weights  # (B, H, T_q, T_k)
        grad_merged, w_o_grads = self.w_o.backward(grad_output)  # (B, T_q, d_model)
        # merge_heads only moves numbers around: its backward is its inverse, split_heads
        grad_context = self.split_heads(grad_merged)  # (B, H, T_q, d_k)
        # (B, H, T_q, d_k), (B, H, T_k, d_k), (B, H, T_k, d_k)
        grad_q, grad_k, grad_v = scaled_dot_product_attention_backward(
            q, k, v, weights, grad_context, self.dropout
        )  # (B, H, T, d_k) each
        grad_k = repeat_kv_backward(grad_k, self.groups)  # (B, H_kv, T_k, d_k)
        grad_v = repeat_kv_backward(grad_v, self.groups)  # (B, H_kv, T_k, d_k)
        grad_q, _ = self.rotary.backward(grad_q)  # (B, H, T_q, d_k)
        grad_k, _ = self.rotary.backward(grad_k)  # (B, H_kv, T_k, d_k)
        # and split_heads' backward is merge_heads
        grad_query, w_q_grads = self.w_q.backward(self.merge_heads(grad_q))  # (B, T_q, d_model)
        grad_key, w_k_grads = self.w_k.backward(self.merge_heads(grad_k))  # (B, T_k, d_model)
        grad_value, w_v_grads = self.w_v.backward(self.merge_heads(grad_v))  # (B, T_k, d_model)
        grads = (
            with_prefix("w_q", w_q_grads)
            | with_prefix("w_k", w_k_grads)
            | with_prefix("w_v", w_v_grads)
            | with_prefix("w_o", w_o_grads)
        )
        return (grad_query, grad_key, grad_value), grads

    def self_attention_backward(self, grad_output: Array) -> tuple[Array, dict]:
        """``backward`` for self-attention, where one x was the query, the key and the value:
        x's gradient is the sum of the three. -> grad_x (B, T, d_model), grads."""
        (grad_query, grad_key, grad_value), grads = self.backward(grad_output)  # (B, T, d_model) x3
        return grad_query + grad_key + grad_value, grads  # (B, T, d_model)

    def cross_attention_backward(self, grad_output: Array) -> tuple[tuple[Array, Array], dict]:
        """``backward`` for cross-attention, where one memory was the key and the value: the
        memory's gradient is the sum of the two. -> (grad_query (B, T_q, d_model), grad_memory
        (B, T_k, d_model)), grads."""
        # (B, T_q, d_model), (B, T_k, d_model), (B, T_k, d_model)
        (grad_query, grad_key, grad_value), grads = self.backward(grad_output)
        return (grad_query, grad_key + grad_value), grads  # (B, T_q, d_model), (B, T_k, d_model)


    def key_value(
        self,
        key: Array | None,
        value: Array | None,
        cache: KeyValueCache | None = None,
        position: Position = 0,
    ) -> tuple[Array, Array]:
        """key and value (B, T, d_model) at positions position .. position + T - 1 -> the keys and
        values the queries attend over, (B, H_kv, T, d_k) each, the keys rotated. With a cache
        (decoding) they join those of every earlier position, (B, H_kv, T_cache, d_k) each; key
        and value None: the cache's as they are (cross-attention: the memory's, projected once)."""
        k = v = None
        if key is not None:
            k = self.rotary(self.split_heads(self.w_k(key)), position)  # (B, H_kv, T, d_k)
            v = self.split_heads(self.w_v(value))  # (B, H_kv, T, d_k)
        if cache is not None:
            k, v = cache.update(k, v, position)  # (B, H_kv, T_cache, d_k) each
        return k, v

    def empty_cache(self, batch: int) -> KeyValueCache:
        """The keys and values of no token yet, each (B, H_kv, 0, d_k) in NumPy and torch, grown
        by ``update``; in JAX a fixed-size buffer of (B, H_kv, max_len, d_k) zeros it writes
        into."""
        empty = np.zeros(
            (batch, self.num_kv_heads, 0, self.d_k), self.w_k.weight.dtype
        )  # (B, H_kv, 0, d_k)
        return KeyValueCache(empty, empty)


class AttentionHead(Module):
    """One head as the PyTorch tutorials write it: its own Linear(d_model, d_k) for q, k and v."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.w_q = Linear(config.d_model, config.d_k, config.bias, dtype)
        self.w_k = Linear(config.d_model, config.d_k, config.bias, dtype)
        self.w_v = Linear(config.d_model, config.d_k, config.bias, dtype)

    def __call__(
        self, query: Array, key: Array, value: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        # a head axis of size 1, so 4-D masks broadcast
        q = self.w_q(query)[:, None]  # (B, 1, T_q, d_k)
        k = self.w_k(key)[:, None]  # (B, 1, T_k, d_k)
        v = self.w_v(value)[:, None]  # (B, 1, T_k, d_k)
        # (B, 1, T_q, d_k), (B, 1, T_q, T_k)
        context, weights = scaled_dot_product_attention(q, k, v, mask)
        return context[:, 0], weights[:, 0]  # (B, T_q, d_k), (B, T_q, T_k)


class MultiHeadAttentionLoop(Module):
    """The tutorials' multi-head attention: a Python list of heads, concatenated, then w_o.

    Mathematically the same as :class:`MultiHeadAttention` given the same weights
    (``transformer_spec.attention_to_heads`` slices them); H small matmuls instead of one
    (under ``jax.jit`` the Python loop is unrolled at trace time into H copies of the ops).
    """

    schema = "attention_heads"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.heads = [AttentionHead(config, dtype) for _ in range(config.num_heads)]
        self.w_o = Linear(config.d_model, config.d_model, config.bias, dtype)

    def __call__(
        self,
        query: Array,
        key: Array,
        value: Array,
        mask: Array | None = None,
        need_weights: bool = False,
    ) -> tuple[Array, Array | None]:
        check_attention_projections(query.shape, key.shape, value.shape, self.config.d_model)
        # H x ((B, T_q, d_k), (B, T_q, T_k))
        outputs = [head(query, key, value, mask) for head in self.heads]
        context = np.concatenate([c for c, _ in outputs], axis=-1)  # (B, T_q, d_model)
        weights = np.stack([w for _, w in outputs], axis=1)  # (B, H, T_q, T_k)
        return self.w_o(context), (weights if need_weights else None)  # (B, T_q, d_model), weights
