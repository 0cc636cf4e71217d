"""Solutions to chapter 5's exercises (multi-head attention): one function per exercise, named as the exercise."""

import math

import numpy as np


def split_heads(x, num_heads):
    batch, seq_len, d_model = x.shape
    x = x.reshape(batch, seq_len, num_heads, d_model // num_heads)  # (B, T, H, d_k): head h = block h of features
    return x.transpose(0, 2, 1, 3)  # (B, H, T, d_k)


def merge_heads(x):
    batch, heads, seq_len, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * d_k)  # (B, T, H, d_k) -> (B, T, H * d_k)


def repeat_kv(x, groups):
    return np.repeat(x, groups, axis=1)  # (B, H_kv * groups, T, d_k): kv heads 0, 0, .., 1, 1, ..


def _attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d_k)) v with the masked softmax of chapter 4 (an empty row gives zeros)."""
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T_q, T_k)
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(row_max), row_max, 0.0))
    total = exp.sum(axis=-1, keepdims=True)
    return exp / np.where(total > 0, total, 1.0) @ v  # (B, H, T_q, d_k)


def multi_head_attention(query, key, value, mask, params, num_heads):
    d_k = query.shape[-1] // num_heads

    def linear(x, name):  # weights stored [in, out]
        return x @ params[f"{name}.weight"] + params[f"{name}.bias"]

    q = split_heads(linear(query, "w_q"), num_heads)  # (B, H, T_q, d_k)
    num_kv_heads = params["w_k.weight"].shape[1] // d_k
    k = split_heads(linear(key, "w_k"), num_kv_heads)  # (B, H_kv, T_k, d_k)
    v = split_heads(linear(value, "w_v"), num_kv_heads)  # (B, H_kv, T_k, d_k)
    groups = num_heads // num_kv_heads
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, T_k, d_k) each
    context = _attention(q, k, v, mask)  # (B, H, T_q, d_k)
    return linear(merge_heads(context), "w_o")  # (B, T_q, d_model)
