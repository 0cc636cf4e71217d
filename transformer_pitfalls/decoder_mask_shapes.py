"""The pitfall "decoder-mask-shapes": Decoder masks: self-attention vs cross-attention shapes."""

from __future__ import annotations

import math

import numpy as np

from .common import CONFIG, _backend, _error, _g, _ops
from .registry import BACKENDS, Demonstration, register, source
from .scale_by_d_model import ours_attention


def wrong_decoder_self_attention_mask(ops, tgt_ids, pad_id):
    tgt_pad = (tgt_ids == pad_id)[:, None, :, None]  # (B, 1, T, 1): llm-notes puts the padding on the *query* axis
    positions = ops.arange(tgt_ids.shape[1])  # (T,)
    causal = (positions[None, :] > positions[:, None])[None, None]  # (1, 1, T, T): torch.triu(ones, diagonal=1)
    return tgt_pad | causal  # (B, 1, T, T), True = blocked: a padded query has every key blocked


def wrong_cross_attention_mask(src_ids, pad_id):
    return (src_ids == pad_id)[:, None, :]  # (B, 1, T_src), from-scratch's src_mask shape; the scores are 4-D


def wrong_attention_finite_fill(ops, q, k, v, blocked):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T_q, T_k)
    scores = ops.where(blocked, -1e9, scores)  # llm-notes: masked_fill(mask, -1e9); broadcasts whatever fits
    weights = ops.softmax(scores)  # a fully blocked row is all -1e9: uniform weights 1 / T_k
    return weights @ v, weights  # (B, H, T_q, d_k)


def ours_decoder_masks(impl, tgt_ids, src_ids, pad_id):
    self_mask = impl.make_decoder_mask(tgt_ids, pad_id)  # (B, 1, T_tgt, T_tgt): causal AND key not padding
    cross_mask = impl.make_cross_attention_mask(src_ids, pad_id)  # (B, 1, 1, T_src): source padding, as keys
    return self_mask, cross_mask  # True = may attend


@register(
    "decoder-mask-shapes",
    "Decoder masks: self-attention vs cross-attention shapes",
    BACKENDS,
    tutorials=("llm-notes", "from-scratch"),
)
def decoder_mask_shapes(backend: str) -> Demonstration:
    """The LLM notes OR a (B, 1, T, 1) target-padding mask into the causal mask: the padding lands on
    the query axis, so each padded query has every key blocked, and with its -1e9 fill such a row
    attends uniformly to all positions, future ones included (with -inf it would be NaN). The
    from-scratch tutorial's author gave up on the decoder's masks: its demo passes a 3-D
    (B, 1, T_src) source mask against 4-D (B, H, T_tgt, T_src) scores, which broadcasts the batch
    axis onto the heads axis: it raises when B != num_heads, and when B == num_heads (8 and 8 in
    its demo) head h silently uses sentence h's padding. Ours: (B, 1, T, T) = causal AND
    key-not-padding for self-attention, (B, 1, 1, T_src) for cross-attention, and any mask that is
    not 4-D is refused."""
    b, ops = _backend(backend), _ops(backend)
    rng = np.random.default_rng(9)
    heads, d_k, pad = CONFIG.num_heads, 4, CONFIG.pad_id
    tgt_ids = np.array([[1, 5, 7, 2, 4], [1, 6, 2, 0, 0], [1, 3, 3, 3, 2]])  # (B=3, T_tgt=5)
    src_ids = np.array([[4, 8, 9, 3, 5, 6, 2], [7, 5, 3, 2, 0, 0, 0], [6, 2, 0, 0, 0, 0, 0]])  # (B=3, T_src=7)
    wrong_self = b.to_numpy(wrong_decoder_self_attention_mask(ops, b.asarray(tgt_ids), pad))  # True = blocked
    wrong_cross = wrong_cross_attention_mask(b.asarray(src_ids), pad)  # (B, 1, T_src), True = blocked
    ours_self, ours_cross = map(b.to_numpy, ours_decoder_masks(b.impl, *map(b.asarray, (tgt_ids, src_ids)), pad))

    # Self-attention: the two masks through attention, on the same q, k, v.
    q, k, v = (rng.standard_normal((3, heads, 5, d_k)) for _ in range(3))  # (B, H, T_tgt, d_k)
    _, wrong_w = wrong_attention_finite_fill(ops, *map(b.asarray, (q, k, v, wrong_self)))
    _, ours_w = ours_attention(b.impl, *map(b.asarray, (q, k, v, ours_self)))
    wrong_w, ours_w = b.to_numpy(wrong_w), b.to_numpy(ours_w)  # (B, H, T_tgt, T_tgt)
    future = np.triu(np.ones((5, 5), dtype=bool), 1)  # (T_q, T_k): key after query
    tgt_real = tgt_ids != pad  # (B, T_tgt)

    # Cross-attention: decoder queries over encoder keys and values.
    q_x = rng.standard_normal((3, heads, 5, d_k))  # (B, H, T_tgt, d_k)
    k_x, v_x = (rng.standard_normal((3, heads, 7, d_k)) for _ in range(2))  # (B, H, T_src, d_k)
    first_two = [b.asarray(a[:2]) for a in (q_x, k_x, v_x)]  # B = 2 != 3 heads
    cross_error_type, cross_error = _error(
        lambda: wrong_attention_finite_fill(ops, *first_two, wrong_cross_attention_mask(b.asarray(src_ids[:2]), pad))
    )
    _, wrong_x_w = wrong_attention_finite_fill(ops, *map(b.asarray, (q_x, k_x, v_x)), wrong_cross)  # B = 3 = heads
    _, ours_x_w = ours_attention(b.impl, *map(b.asarray, (q_x, k_x, v_x, ours_cross)))
    wrong_x_w, ours_x_w = b.to_numpy(wrong_x_w), b.to_numpy(ours_x_w)  # (B, H, T_tgt, T_src)
    src_pad = (src_ids == pad)[:, None, None, :]  # (B, 1, 1, T_src): each sentence's own padding
    keep_3d = b.asarray(src_ids != pad)[:, None, :]  # the tutorial's 3-D shape, with our polarity
    ours_error_type, ours_error = _error(lambda: ours_attention(b.impl, *map(b.asarray, (q_x, k_x, v_x)), keep_3d))

    numbers = {
        "batch": 3,
        "num_heads": heads,
        "wrong_self_mask_shape": tuple(wrong_self.shape),
        "ours_self_mask_shape": tuple(ours_self.shape),
        "wrong_fully_blocked_rows": int(wrong_self.all(-1).sum()),
        "ours_fully_blocked_rows": int((~ours_self).all(-1).sum()),
        "wrong_max_weight_on_future": float(wrong_w[..., future].max()),
        "ours_max_weight_on_future": float(ours_w[..., future].max()),
        "self_real_rows_max_difference": float(np.abs(wrong_w - ours_w).transpose(0, 2, 1, 3)[tgt_real].max()),
        "wrong_cross_mask_shape": tuple(np.shape(b.to_numpy(wrong_cross))),
        "ours_cross_mask_shape": tuple(ours_cross.shape),
        "wrong_cross_error_type_batch_2": cross_error_type,
        "wrong_cross_error_batch_2": cross_error,
        "wrong_cross_max_weight_on_own_padding": float(np.where(src_pad, wrong_x_w, 0.0).max()),
        "ours_cross_max_weight_on_own_padding": float(np.where(src_pad, ours_x_w, 0.0).max()),
        "ours_error_type_for_3d_mask": ours_error_type,
        "ours_error_for_3d_mask": ours_error,
    }
    return Demonstration(
        pitfall="decoder-mask-shapes",
        backend=backend,
        wrong_code=source(wrong_decoder_self_attention_mask, wrong_cross_attention_mask, wrong_attention_finite_fill),
        ours_code=source(ours_decoder_masks, ours_attention),
        wrong=(
            f"self mask {numbers['wrong_self_mask_shape']}: {numbers['wrong_fully_blocked_rows']} fully blocked rows, "
            f"up to {_g(numbers['wrong_max_weight_on_future'])} of a padded query's weight on future positions; "
            f"cross mask {numbers['wrong_cross_mask_shape']}: with batch 2 != {heads} heads raises "
            f"{cross_error_type}, with batch 3 = {heads} heads puts up to "
            f"{_g(numbers['wrong_cross_max_weight_on_own_padding'])} of a weight on the sentence's own padding"
        ),
        ours=(
            f"self mask {numbers['ours_self_mask_shape']}, {numbers['ours_fully_blocked_rows']} fully blocked rows, "
            f"future weight {_g(numbers['ours_max_weight_on_future'])}; cross mask {numbers['ours_cross_mask_shape']}, "
            f"padding weight {_g(numbers['ours_cross_max_weight_on_own_padding'])}; a 3-D mask raises "
            f"{ours_error_type}: {ours_error}"
        ),
        numbers=numbers,
    )
