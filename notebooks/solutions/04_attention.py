"""Solutions to chapter 4's exercises (attention): one function per exercise, named as the exercise."""

import math

import numpy as np


def masked_softmax(scores, mask):
    scores = np.where(mask, scores, -np.inf)  # (..., T_q, T_k): a masked key's weight will be exp(-inf) = 0
    row_max = scores.max(axis=-1, keepdims=True)  # (..., T_q, 1); -inf in a row with no allowed key
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # such a row subtracts 0: no -inf - -inf = NaN
    exp = np.exp(scores - row_max)  # (..., T_q, T_k): every exponent <= 0, no overflow
    total = exp.sum(axis=-1, keepdims=True)  # (..., T_q, 1); 0 in an empty row
    return exp / np.where(total > 0, total, 1.0)  # an empty row: 0 / 1 = 0


def attention(q, k, v, mask, d_model):
    d_k = q.shape[-1]  # the per-head size; d_model is not needed
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d_k)  # (B, H, T_q, d_k) @ (B, H, d_k, T_k) -> (B, H, T_q, T_k)
    return masked_softmax(scores, mask) @ v  # (B, H, T_q, T_k) @ (B, H, T_k, d_v) -> (B, H, T_q, d_v)
