"""Tiled attention: softmax(q k^T / sqrt(d_k)) v with the keys and values a block at a time.

The plain attention (attention.py) makes the whole (..., T_q, T_k) scores and weights: at
8 heads and T = 8192 that is 2 GiB per array in float32, and the memory of long sequences.
FlashAttention (Dao et al. 2022, Algorithm 1) never holds them. It reads ``block_size`` keys
and values at a time and keeps, per query row, the largest score seen so far (the running
max m) and the sum of exp(score - m) so far (the running sum l). When a block raises a row's
max, what was summed so far is rescaled by exp(m_old - m_new), so that every term ends up
relative to the same max: the result is the plain attention's, up to rounding, and memory
holds one (..., T_q, block_size) block of scores.

The same masks as the plain attention (bool, True = may attend), and the same answer for a
query row with no allowed key: 0, never NaN (its max stays -inf, its sum 0, and it divides
by 1). NumPy's hand-written backward recomputes each block's weights from the
saved logsumexp (log of each row's softmax denominator) instead of keeping them.
"""

from __future__ import annotations

import math

import numpy as np
from numpy import ndarray as Array

from transformer_spec.checks import check_attention_inputs, check_block_size

from .checks import check_float_inputs, check_mask
from .module import Module

BLOCK_SIZE = 128  # keys per block: a (..., T_q, 128) block of scores at a time


def tiled_attention(
    q: Array, k: Array, v: Array, mask: Array | None = None, block_size: int = BLOCK_SIZE
) -> tuple[Array, Array]:
    """softmax(q k^T / sqrt(d_k)) v, keys and values in blocks of ``block_size`` -> (context
    (..., T_q, d_v), logsumexp (..., T_q, 1)): the log of each row's softmax denominator,
    all the backward needs to recompute the weights (0 for a row with no allowed key)."""
    check_attention_inputs(q.shape, k.shape, v.shape)
    check_float_inputs(("q", "k", "v"), (q, k, v))
    check_block_size(block_size)
    check_mask("mask", mask, (*q.shape[:-1], k.shape[-2]))  # (B, H, T_q, T_k) or (..., T_q, T_k)
    scale = math.sqrt(q.shape[-1])
    row_max = np.full_like(q[..., :1], -math.inf)  # (..., T_q, 1): the largest score so far
    row_sum = np.zeros_like(row_max)  # (..., T_q, 1): sum of exp(score - row_max) so far
    # (..., T_q, d_v): sum of exp(score - row_max) v so far
    context = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    for start in range(0, k.shape[-2], block_size):
        stop = start + block_size
        k_block = k[..., start:stop, :]  # (..., T_b, d_k), T_b <= block_size
        v_block = v[..., start:stop, :]  # (..., T_b, d_v)
        scores = q @ k_block.swapaxes(-1, -2) / scale  # (..., T_q, d_k) @ (..., d_k, T_b)
        if mask is not None:  # a mask of size 1 along the keys holds for every block
            allowed = mask[..., start:stop] if mask.shape[-1] > 1 else mask  # (..., T_q|1, T_b|1)
            scores = np.where(allowed, scores, -math.inf)  # (..., T_q, T_b)
        block_max = scores.max(axis=-1, keepdims=True)  # (..., T_q, 1)
        new_max = np.maximum(row_max, block_max)  # (..., T_q, 1); -inf while nothing is allowed
        # a row with nothing allowed yet subtracts 0: exp(-inf - -inf) would be NaN
        shift = np.where(np.isfinite(new_max), new_max, 0.0)  # (..., T_q, 1)
        exp = np.exp(scores - shift)  # (..., T_q, T_b), exactly 0 at masked keys
        # what was summed relative to the old max, now relative to the new: exp(m_old - m_new)
        correction = np.exp(row_max - shift)  # (..., T_q, 1), <= 1; 0 while the old max is -inf
        row_sum = correction * row_sum + exp.sum(axis=-1, keepdims=True)  # (..., T_q, 1)
        context = correction * context + exp @ v_block  # (..., T_q, T_b) @ (..., T_b, d_v)
        row_max = new_max  # (..., T_q, 1)
    # an empty row divides by 1: 0 / 1 = 0, not 0 / 0
    total = np.where(row_sum > 0, row_sum, 1.0)  # (..., T_q, 1)
    shift = np.where(np.isfinite(row_max), row_max, 0.0)  # (..., T_q, 1)
    logsumexp = shift + np.log(total)  # (..., T_q, 1): log sum_j exp(score_j)
    return context / total, logsumexp  # (..., T_q, d_v), (..., T_q, 1)


def tiled_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    context: Array,
    logsumexp: Array,
    grad_context: Array,
    block_size: int = BLOCK_SIZE,
) -> tuple[Array, Array, Array]:
    """grad_context (..., T_q, d_v) -> grad_q (..., T_q, d_k), grad_k, grad_v (..., T_k, d_k|d_v),
    FlashAttention's backward: each block's weights recomputed from the forward's ``logsumexp``,
    never the whole (..., T_q, T_k) at once.

    The softmax's backward, ds_j = w_j (dw_j - sum_i dw_i w_i), needs one inner product per
    row; with dw = grad_context v^T it is sum_i dw_i w_i = grad_context . context, read off the
    output (FlashAttention's D) without the weights. Masked keys have w = 0: they get 0, and a
    row with no allowed key (w = 0, context = 0) gets 0 everywhere.
    """
    scale = math.sqrt(q.shape[-1])
    inner = (grad_context * context).sum(axis=-1, keepdims=True)  # (..., T_q, 1): D
    grad_q = np.zeros_like(q)  # (..., T_q, d_k), summed over the blocks
    grad_k = np.zeros_like(k)  # (..., T_k, d_k), written block by block
    grad_v = np.zeros_like(v)  # (..., T_k, d_v)
    for start in range(0, k.shape[-2], block_size):
        stop = start + block_size
        k_block = k[..., start:stop, :]  # (..., T_b, d_k)
        v_block = v[..., start:stop, :]  # (..., T_b, d_v)
        scores = q @ k_block.swapaxes(-1, -2) / scale  # (..., T_q, T_b), as the forward's
        if mask is not None:
            allowed = mask[..., start:stop] if mask.shape[-1] > 1 else mask  # (..., T_q|1, T_b|1)
            scores = np.where(allowed, scores, -math.inf)  # (..., T_q, T_b)
        weights = np.exp(scores - logsumexp)  # (..., T_q, T_b): the forward's softmax, again
        # context = weights @ v
        grad_v[..., start:stop, :] = weights.swapaxes(-1, -2) @ grad_context  # (..., T_b, d_v)
        grad_weights = grad_context @ v_block.swapaxes(-1, -2)  # (..., T_q, d_v) @ (..., d_v, T_b)
        # weights = softmax(scores) over the whole row: its inner product is D, from the output
        grad_scores = weights * (grad_weights - inner)  # (..., T_q, T_b)
        # scores = q @ k_block^T / sqrt(d_k)
        grad_q += grad_scores @ k_block / scale  # (..., T_q, T_b) @ (..., T_b, d_k)
        grad_k[..., start:stop, :] = grad_scores.swapaxes(-1, -2) @ q / scale  # (..., T_b, d_k)
    return grad_q, grad_k, grad_v


class TiledAttention(Module):
    """``tiled_attention`` as a module: the block size fixed when it is built, and in NumPy what
    the hand-written backward reads kept by name."""

    def __init__(self, block_size: int = BLOCK_SIZE):
        super().__init__()
        check_block_size(block_size)
        self.block_size = block_size

    def __call__(self, q: Array, k: Array, v: Array, mask: Array | None = None) -> Array:
        """q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) -> context (..., T_q, d_v)."""
        # (..., T_q, d_v), (..., T_q, 1)
        context, logsumexp = tiled_attention(q, k, v, mask, self.block_size)
        # differs: numpy-autograd
        self.keep(q=q, k=k, v=v, mask=mask, context=context, logsumexp=logsumexp)
        return context

    def backward(self, grad_context: Array) -> tuple[tuple[Array, Array, Array], dict]:
        """grad_context (..., T_q, d_v) -> (grad_q, grad_k, grad_v), and no parameters' grads."""
        q, k, v = self.saved.q, self.saved.k, self.saved.v  # (..., T_q|T_k, d_k|d_v)
        mask = self.saved.mask  # (..., T_q|1, T_k|1) or None
        context, logsumexp = self.saved.context, self.saved.logsumexp  # (..., T_q, d_v|1)
        grads = tiled_attention_backward(
            q, k, v, mask, context, logsumexp, grad_context, self.block_size
        )  # (..., T_q, d_k), (..., T_k, d_k), (..., T_k, d_v)
        return grads, {}
