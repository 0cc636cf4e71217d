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

from transformer_spec.kernels import (
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

from .checks import check_mask

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
    """``GatedFeedForward.forward`` for SwiGLU, the gate's SiLU in one pass."""
    if module.config.activation != "silu":
        return NotImplemented
    module.check_inputs(x)  # as the forward it stands in for
    hidden = F.silu(module.w_gate(x)) * module.w_up(x)  # (B, T, d_ff)
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
        qkv = F.linear(query, *_packed(module.w_q, module.w_k, module.w_v))  # (B, T, d_q + 2 d_kv)
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
    if cache is not None:  # a decoding step: three small products beat packing weights per step
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
    """Stores ``model``'s matrices as a one-row product reads them fastest, in place: each Linear
    weight [out, in], and the token table a tied output projection reads as its transpose,
    becomes the transpose of a contiguous [in, out] array (``weight.t().contiguous().t()``). The
    values, shapes and names stay; only the strides change (``state_dict`` keeps working, and
    training after it too). Nothing when fused kernels are off, or already laid out so."""
    if not fused_kernels_enabled():
        return
    matrices = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if getattr(model.config, "tie_output", False):
        matrices.append(model.tgt_embed.token.weight)  # (V, d_model), read as x @ table.T
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors: trainable afterwards
        for weight in matrices:
            if weight.dim() == 2 and weight.stride() != (1, weight.shape[0]):
                weight.data = weight.data.t().contiguous().t()  # (out, in), strides (1, out)
