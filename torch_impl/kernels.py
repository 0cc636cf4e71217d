"""Speed, in one place: the fused kernels torch runs instead of the written-out math.

The component files show the math; a teaching function or forward with a faster equivalent
carries one marked line, ``@fusable(name)``, and the kernel registered here under that name
runs instead while fused kernels are enabled (``transformer_spec.kernels`` has the switch and
how a call is dispatched). ``shared_tests/components/test_fast_paths.py`` holds every kernel
equal to the code it replaces.

torch's kernels:

* ``layer_norm``: ``F.layer_norm``, one pass over (..., d_model) where the written-out
  mean, variance, normalise, scale and shift make six.
* ``gelu``: ``F.gelu``, the same exact GELU in one pass where the written-out one makes
  five (~5x its time at BERT-base size).
* ``feed_forward``: in inference, w_1 and the activation (ReLU or exact GELU) in
  ``torch._addmm_activation``, as ``nn.TransformerEncoderLayer``'s eval fast path runs them:
  the activation works in place on w_1's output, so no second (B, T, d_ff) array is made
  (each fresh large array costs its page faults: ~2 ms a layer at base size).
* ``rms_norm``: ``F.rms_norm``, one pass where the written-out square, mean, root, divide
  and scale make five.
* ``gated_feed_forward``: ``F.silu`` on the gate (one pass, not three) for SwiGLU.
* ``multi_head_attention``: ``F.scaled_dot_product_attention``, which never holds the whole
  (B, H, T_q, T_k) scores, with the q, k and v projections packed into one matmul when they
  read the same input (self-attention; k and v alone for cross-attention), as
  ``nn.MultiheadAttention`` stores them; grouped-query keys and values are not repeated
  (``enable_gqa``). Not when the weights are wanted or dropped out.
  A decoding step (with a key/value cache) takes the same kernel.

And one for decoding, applied by the cached stepper (``generate.CachedStepper``) rather than
in place of a forward:

* ``decoding_layout``: every Linear weight (and a tied output projection's table) stored
  column by column, the same [out, in] values in [in, out] memory, so that ``F.linear``'s
  one-row product reads the matrix as rows: at batch 1 a decoding step is one such product
  per weight and reads every weight once, and this CPU's BLAS reads the transposed layout
  ~1.3x faster (measured by ``bench``'s SmolLM2 section against the memory-read rate).

A query row with no allowed key is 0 on every path: the attention kernel lets such a row
attend to every key inside the kernel (finite, also in the backward pass) and zeroes it
after.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from transformer_spec.checks import check_rows
from transformer_spec.kernels import (
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

from .checks import check_mask
from .positional import rotate_pairs

__all__ = [
    "KERNELS",
    "decoding_layout",
    "fusable",
    "fused_kernels",
    "fused_kernels_enabled",
    "use_fused_kernels",
]

KERNELS: dict[str, Callable] = {}  # name -> kernel, filled below
fusable = fusable_in(KERNELS)  # the decorator of the marked lines: @fusable("gelu")


# ----------------------------------------------------------------------------- layer_norm
def layer_norm(module, x: torch.Tensor) -> torch.Tensor:
    """``LayerNorm.forward``: the same biased variance, eps inside the square root."""
    module.check_inputs(x)  # as the forward it stands in for
    return F.layer_norm(x, (x.shape[-1],), module.weight, module.bias, module.eps)  # (..., d_model)


KERNELS["layer_norm"] = layer_norm


# ------------------------------------------------------------------------------- rms_norm
def rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    """``RMSNorm.forward``: eps inside the square root."""
    module.check_inputs(x)  # as the forward it stands in for
    return F.rms_norm(x, (x.shape[-1],), module.weight, module.eps)  # (..., d_model)


KERNELS["rms_norm"] = rms_norm


# ----------------------------------------------------------------------------------- gelu
def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)  # (...,) like x: the exact erf GELU (approximate="none")


KERNELS["gelu"] = gelu


# --------------------------------------------------------------------------- feed_forward
def feed_forward(module, x: torch.Tensor) -> torch.Tensor:
    """``PositionwiseFeedForward.forward`` in inference, the activation in place on w_1's output."""
    activation, w_1, w_2 = module.config.activation, module.w_1, module.w_2
    if (
        activation not in ("relu", "gelu")
        or w_1.bias is None
        or (module.dropout.training and module.dropout.rate > 0)
    ):
        return NotImplemented  # no fused tanh GELU; no bias to fuse; dropout on the hidden layer
    if torch.is_grad_enabled() and (x.requires_grad or w_1.weight.requires_grad):
        return NotImplemented  # the in-place activation would overwrite what autograd keeps
    module.check_inputs(x)  # as the forward it stands in for
    rows = x.reshape(-1, x.shape[-1])  # (N, d_model)
    hidden = torch._addmm_activation(
        w_1.bias, rows, w_1.weight.t(), use_gelu=activation == "gelu"
    )  # (N, d_ff)
    return w_2(hidden).reshape(*x.shape[:-1], w_2.out_features)  # (..., d_model)


KERNELS["feed_forward"] = feed_forward


# --------------------------------------------------------------------- gated_feed_forward
def gated_feed_forward(module, x: torch.Tensor) -> torch.Tensor:
    """``GatedFeedForward.forward`` with the gate's SiLU in one pass (SwiGLU), and, without
    gradients, one product for the gate and up when ``decoding_layout`` packed them."""
    packed = _without_grad(x, (module.w_gate, module.w_up))
    if module.config.activation != "silu" and packed is None:
        return NotImplemented
    module.check_inputs(x)  # as the forward it stands in for
    if packed is not None:
        gate, up = F.linear(x, packed[0].t(), packed[1]).chunk(2, dim=-1)  # (B, T, d_ff) each
    else:
        gate, up = module.w_gate(x), module.w_up(x)  # (B, T, d_ff) each
    activation = F.silu if module.config.activation == "silu" else module.activation
    hidden = activation(gate) * up  # (B, T, d_ff)
    return module.w_down(module.dropout(hidden))  # (B, T, d_model)


KERNELS["gated_feed_forward"] = gated_feed_forward


# ------------------------------------------------------------------- multi_head_attention
def _packed(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Several Linear layers reading the same input -> one weight [sum of outs, in] and bias."""
    weight = torch.cat([linear.weight for linear in linears])  # (sum of outs, d_model)
    if any(linear.bias is None for linear in linears):
        return weight, None
    return weight, torch.cat([linear.bias for linear in linears])  # (sum of outs,)


def attention_context(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``scaled_dot_product_attention``'s context alone, in ``F.scaled_dot_product_attention``;
    k and v may have fewer heads than q (grouped-query attention: ``enable_gqa`` reads kv head
    h // groups for query head h, as ``repeat_kv``, without making the copies).

    That kernel takes our mask as it is (bool, True = may attend). For a query row with no
    allowed key its implementations disagree (NaN, zeros or the mean of v); ours gives 0: the
    row attends to every key (finite, also in the backward pass) and is zeroed afterwards. A
    mask that allows every key (each decoding step of an unpadded batch) is not passed at all:
    the kernel then skips turning it into an additive mask and adding it (10-30% of its
    time for a (B, 9, 1, T) decoding step).
    """
    gqa = q.shape[-3] != k.shape[-3]
    if mask is not None and torch.compiler.is_compiling():  # differs: torch-compile
        # no host sync in a compiled graph (a value read breaks it in two): the general case
        has_key = mask.any(dim=-1, keepdim=True)  # (B|1, 1, T_q|1, 1)
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask | ~has_key, enable_gqa=gqa
        )  # (..., T_q, d_v)
        return context.masked_fill(~has_key, 0.0)  # (..., T_q, d_v)
    # every key allowed (a decoding step without padding): nothing to mask
    if mask is None or mask.all():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)  # (..., T_q, d_v)
    has_key = mask.any(dim=-1, keepdim=True)  # (B|1, 1, T_q|1, 1)
    if has_key.all():  # the usual case (a host sync: cheap on the CPU), and 20% faster at base size
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=gqa
        )  # (..., T_q, d_v)
    # (..., T_q, d_v): a row with no allowed key attends to every key here, zeroed below
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, enable_gqa=gqa)
    return context.masked_fill(~has_key, 0.0)  # (..., T_q, d_v), 0 where no key was allowed


def _projections(module, query, key, value) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, T_q, d_q), k and v (B, T_k, d_kv), in one matmul where they read the same input, as
    ``nn.MultiheadAttention`` packs them: q, k and v for self-attention, k and v for
    cross-attention over the memory."""
    d_q, d_kv = module.w_q.out_features, module.w_k.out_features
    if query is key and key is value:  # self-attention: one (d_model, d_q + 2 d_kv) matmul
        packed = _without_grad(query, (module.w_q, module.w_k, module.w_v))  # packed once
        if packed is not None:
            weight, bias = packed[0].t(), packed[1]
        else:  # or per call
            weight, bias = _packed(module.w_q, module.w_k, module.w_v)
        qkv = F.linear(query, weight, bias)  # (B, T, d_q + 2 d_kv)
        return qkv.split([d_q, d_kv, d_kv], dim=-1)  # (B, T, d_q), (B, T, d_kv) x2
    if key is value:  # cross-attention: the memory's keys and values in one matmul
        k, v = F.linear(key, *_packed(module.w_k, module.w_v)).chunk(2, dim=-1)  # (B, T_k, d_kv) x2
        return module.w_q(query), k, v  # (B, T_q, d_q), (B, T_k, d_kv) x2
    return module.w_q(query), module.w_k(key), module.w_v(value)  # (B, T_q|T_k, d_q|d_kv)


def multi_head_attention(
    module, query, key, value, mask=None, need_weights=False, cache=None, position=0
):
    """``MultiHeadAttention.forward`` without the (B, H, T_q, T_k) weights."""
    if need_weights or (module.dropout.training and module.dropout.rate > 0):
        return NotImplemented  # the weights are wanted, or dropped out (with our dropout mask)
    module.check_inputs(query, key, value, mask, cache, position)  # as the forward it stands in for
    packed = None
    if cache is not None and query is key and key is value:
        packed = _without_grad(query, (module.w_q, module.w_k, module.w_v))
    if packed is not None:  # a decoding step: one product for q, k and v (decoding_layout)
        d_q, d_kv = module.w_q.out_features, module.w_k.out_features
        qkv = F.linear(query, packed[0].t(), packed[1])  # (B, T_q, d_q + 2 d_kv)
        q, k, v = qkv.split([d_q, d_kv, d_kv], dim=-1)  # (B, T_q, d_q), (B, T_q, d_kv) x2
        q = module.rotary(module.split_heads(q), position)  # (B, H, T_q, d_k)
        k = module.rotary(module.split_heads(k), position)  # (B, H_kv, T_q, d_k)
        k, v = cache.update(k, module.split_heads(v), position)  # (B, H_kv, T_cache, d_k) each
        check_mask("mask", mask, (*q.shape[:-1], k.shape[-2]))
    elif cache is not None:  # a decoding step: unpacked weights (three small products)
        q = module.rotary(module.split_heads(module.w_q(query)), position)  # (B, H, T_q, d_k)
        k, v = module.key_value(key, value, cache, position)  # (B, H_kv, T_cache, d_k) each
        check_mask("mask", mask, (*q.shape[:-1], k.shape[-2]))
    else:
        q, k, v = _projections(module, query, key, value)  # (B, T_q|T_k, d_q|d_kv)
        q, k = module.rotary(module.split_heads(q)), module.rotary(module.split_heads(k))
        v = module.split_heads(v)  # (B, H_kv, T_k, d_k)
    context = module.merge_heads(attention_context(q, k, v, mask))  # (B, T_q, d_q)
    return module.w_o(context), None  # (B, T_q, d_model)


KERNELS["multi_head_attention"] = multi_head_attention


# ------------------------------------------------------------------------ decoding_layout
def decoding_layout(model: torch.nn.Module) -> None:
    """Stores ``model``'s matrices as a one-row product reads them fastest, in place: a Linear
    weight [out, in] with at least as many outputs as inputs, and the token table a tied output
    projection reads as its transpose, becomes the transpose of a contiguous [in, out] array
    (``weight.t().contiguous().t()``); one with fewer outputs (the feed-forward's down matrix)
    stays [out, in] rows, each output one contiguous dot product (MKL: 25 against 20 GB/s at
    SmolLM2's 1536 x 576, and the other way round for the wide ones, measured by
    ``bench.decode_profile``'s products). Then the matrices a decoding step multiplies by the same
    rows (each self-attention's q, k and v; each gated feed-forward's gate and up) become the
    column blocks of one [in, sum of outs] matrix (``packed_columns``): one product for each
    group. The values, shapes and names stay; only the strides change (``state_dict`` keeps
    working, and training after it too). Nothing when fused kernels are off, or already laid
    out so."""
    if not fused_kernels_enabled():
        return
    matrices = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if getattr(model.config, "tie_output", False):
        matrices.append(model.tgt_embed.token.weight)  # (V, d_model), read as x @ table.T
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors: trainable afterwards
        for weight in matrices:
            if weight.dim() != 2:
                continue
            if weight.shape[0] < weight.shape[1]:  # fewer outputs than inputs: [out, in] rows
                if weight.stride() != (weight.shape[1], 1):
                    weight.data = weight.data.contiguous()  # (out, in), strides (in, 1)
            elif weight.stride() != (1, weight.shape[0]):
                weight.data = weight.data.t().contiguous().t()  # (out, in), strides (1, out)
        for linears in _reading_one_input(model):
            if packed_columns(linears) is None:
                _pack_columns(linears)


def _reading_one_input(model: torch.nn.Module) -> list[tuple[torch.nn.Linear, ...]]:
    """The Linear layers that read one input: each attention's q, k and v (a decoding step's
    self-attention multiplies them by the same rows; cross-attention keeps them apart), each
    gated feed-forward's gate and up."""
    groups = []
    for module in model.modules():
        if all(hasattr(module, name) for name in ("w_q", "w_k", "w_v")):
            groups.append((module.w_q, module.w_k, module.w_v))
        if hasattr(module, "w_gate") and hasattr(module, "w_up"):
            groups.append((module.w_gate, module.w_up))
    return groups


def _pack_columns(linears: tuple[torch.nn.Linear, ...]) -> None:
    """Linear layers reading one input -> their weights the column blocks of one [in, sum of outs]
    matrix, and their biases the pieces of one vector, in place: one product computes all of
    their outputs (``packed_columns``). Each weight keeps its values, shape and name; only where
    it lives changes."""
    matrix = torch.cat([linear.weight.t() for linear in linears], dim=1).contiguous()  # (in, total)
    biases = None
    if all(linear.bias is not None for linear in linears):
        biases = torch.cat([linear.bias for linear in linears])  # (total,)
    start = 0
    for linear in linears:
        out = linear.out_features
        linear.weight.data = matrix[:, start : start + out].t()  # (out, in), strides (1, total)
        if biases is not None:
            linear.bias.data = biases[start : start + out]  # (out,)
        start += out


def _without_grad(x: torch.Tensor, linears) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``packed_columns(linears)`` when no gradient is wanted (the packed matrix is a view autograd
    would not trace back to each layer's weight); else None."""
    if torch.is_grad_enabled() and (x.requires_grad or linears[0].weight.requires_grad):
        return None
    return packed_columns(linears)


def packed_columns(
    linears: tuple[torch.nn.Linear, ...],
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The [in, sum of outs] matrix (and the bias) ``_pack_columns`` made the layers' weights
    parts of, if they still are (an optimizer or a load may have given a weight storage of its
    own since: then None, and each layer multiplies on its own)."""
    first = linears[0].weight
    address, size = first.data_ptr(), first.element_size()
    total = sum(linear.out_features for linear in linears)
    start = 0
    for linear in linears:  # each the next column block: (out, in) at strides (1, total)
        weight = linear.weight
        if weight.data_ptr() != address + start * size or weight.stride() != (1, total):
            return None
        start += linear.out_features
    last = linears[-1].weight  # in the same storage as the first: the blocks between are too
    if last.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
        return None
    matrix = first.detach().as_strided((first.shape[1], total), (total, 1))  # (in, total)
    if linears[0].bias is None or any(linear.bias is None for linear in linears):
        return matrix, None
    bias = linears[0].bias
    address, start = bias.data_ptr(), 0
    for linear in linears:  # each the next piece of one (total,) vector
        if linear.bias.data_ptr() != address + start * size:
            return None
        start += linear.out_features
    if linears[-1].bias.untyped_storage().data_ptr() != bias.untyped_storage().data_ptr():
        return None
    return matrix, bias.detach().as_strided((total,), (1,))


# ---------------------------------------------------------------------------- decode_step
def decode_step(model, tokens, cache, keep, memory_mask, position, project=True):
    """``generate.decode_step`` for a pre-norm decoder-only model in inference, as one function:
    each layer's packed q|k|v and gate|up products (``decoding_layout``), torch's own norm,
    attention and activation kernels, and no module calls in between. At batch 1 a step is ~30
    layers of small operations around four matrix-vector products each; the modules' calls,
    input checks and trace hooks around them cost as much as the products (measured by
    ``bench.decode_profile``). The tokens and position are checked as the written-out step
    checks them (the embedding's ``token_ids``)."""
    config = model.config
    if config.decoder_has_cross_attention or not config.norm_first or memory_mask is not None:
        return NotImplemented  # an encoder-decoder's step, or post-norm: written out
    if torch.is_grad_enabled() or _dropout_active(model):
        return NotImplemented
    layers = model.decoder.layers
    weights = [_layer_weights(layer) for layer in layers]
    if any(w is None for w in weights):
        return NotImplemented  # not packed (fused kernels were off when the stepper was made)
    from .attention import append_to_cache
    from .generate import make_step_mask

    new = tokens.shape[1]
    keep = append_to_cache(keep, tokens != config.pad_id, position, axis=1)  # (N, T_cache)
    # one query a row and nothing padded: every cached key is allowed, no mask at all
    mask = None if new == 1 and bool(keep.all()) else make_step_mask(keep, position, new)
    x = model.tgt_embed(tokens, offset=position)  # (N, T_new, d_model)
    first = layers[0].self_attn
    d_q, d_kv, d_k = first.w_q.out_features, first.w_k.out_features, first.d_k
    rotary = first.rotary if hasattr(first.rotary, "cos") else None
    if rotary is not None:
        check_rows(position, new, rotary.cos.shape[0])
        # (T_new, d_k / 2) each
        cos, sin = rotary.cos[position : position + new], rotary.sin[position : position + new]
    batch = x.shape[0]
    for layer, layer_cache, (qkv_w, qkv_b, ffn_in_w, ffn_in_b) in zip(
        layers, cache, weights, strict=True
    ):
        attention = layer.self_attn
        qkv = F.linear(_norm(layer.self_attn_norm, x), qkv_w, qkv_b)  # (N, T_new, d_q + 2 d_kv)
        # q's and k's heads side by side, rotated at once: (N, H + H_kv, T_new, d_k)
        qk = qkv[..., : d_q + d_kv].reshape(batch, new, -1, d_k).transpose(1, 2)
        if rotary is not None:
            qk = rotate_pairs(qk, cos, sin, rotary.layout)
        # (N, H, T_new, d_k), (N, H_kv, T_new, d_k)
        q, k = qk[:, : attention.num_heads], qk[:, attention.num_heads :]
        # (N, H_kv, T_new, d_k)
        v = qkv[..., d_q + d_kv :].reshape(batch, new, -1, d_k).transpose(1, 2)
        k, v = layer_cache.self_attn.update(k, v, position)  # (N, H_kv, T_cache, d_k) each
        context = attention_context(q, k, v, mask)  # (N, H, T_new, d_k)
        context = context.transpose(1, 2).reshape(batch, new, d_q)  # (N, T_new, d_q)
        x = x + F.linear(context, attention.w_o.weight, attention.w_o.bias)  # (N, T_new, d_model)
        ffn = layer.ffn
        h = F.linear(_norm(layer.ffn_norm, x), ffn_in_w, ffn_in_b)  # (N, T_new, 2 d_ff | d_ff)
        activation = F.silu if config.activation == "silu" else ffn.activation  # SiLU in one pass
        if hasattr(ffn, "w_gate"):
            gate, up = h.chunk(2, dim=-1)  # (N, T_new, d_ff) each
            h, out = activation(gate) * up, ffn.w_down  # (N, T_new, d_ff)
        else:
            h, out = activation(h), ffn.w_2  # (N, T_new, d_ff)
        x = x + F.linear(h, out.weight, out.bias)  # (N, T_new, d_model)
    if model.decoder.norm is not None:
        x = _norm(model.decoder.norm, x)
    if not project:
        return None, cache, keep
    return model.generator(x, model.tgt_embed.token.weight), cache, keep  # (N, T_new, V)


def _layer_weights(layer) -> tuple | None:
    """(q|k|v matrix [out, in] view, its bias, the feed-forward's first matrix (gate|up, packed),
    its bias) of a layer the stepper packed; None when its weights are not packed."""
    attention = layer.self_attn
    if not all(hasattr(attention, name) for name in ("w_q", "w_k", "w_v")):
        return None  # an attention of another make (one Linear per head): written out
    qkv = packed_columns((attention.w_q, attention.w_k, attention.w_v))
    ffn = layer.ffn
    if hasattr(ffn, "w_gate"):
        first = packed_columns((ffn.w_gate, ffn.w_up))
    else:
        first = ffn.w_1.weight.t(), ffn.w_1.bias
    if qkv is None or first is None:
        return None
    return qkv[0].t(), qkv[1], first[0].t(), first[1]


def _norm(module, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm or RMSNorm in torch's own kernel, without the module's call and input checks (at
    one row those cost twice the kernel)."""
    if hasattr(module, "bias"):  # LayerNorm
        return F.layer_norm(x, (x.shape[-1],), module.weight, module.bias, module.eps)
    return F.rms_norm(x, (x.shape[-1],), module.weight, module.eps)


def _dropout_active(model) -> bool:
    return model.training and model.config.dropout > 0


KERNELS["decode_step"] = decode_step
