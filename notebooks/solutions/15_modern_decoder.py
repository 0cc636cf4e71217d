"""Solutions to chapter 15's exercises (the modern decoder): one function per exercise, named as the exercise."""

import numpy as np


def _cos_sin(seq_len, d_k, offset, theta):
    """cos and sin (T, d_k / 2) of the angles position * theta^(-2i / d_k), positions offset .. offset + T - 1."""
    inverse_frequency = 1.0 / theta ** (np.arange(0, d_k, 2) / d_k)  # (d_k / 2,): pair 0 fastest
    angle = np.outer(offset + np.arange(seq_len), inverse_frequency)  # (T, d_k / 2)
    return np.cos(angle), np.sin(angle)


def rope_rotate_half(x, offset, theta):
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)  # (T, d_k): [i | i]
    x1, x2 = np.split(x, 2, axis=-1)  # features 0 .. d_k/2 - 1 and d_k/2 .. d_k - 1: pair i is (i, i + d_k/2)
    rotated_half = np.concatenate([-x2, x1], axis=-1)  # HF's rotate_half
    return x * cos + rotated_half * sin  # (B, H, T, d_k)


def rope_interleaved(x, offset, theta):
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)  # (T, d_k): [0, 0, 1, 1, ...]
    partner = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)  # pair i is (2i, 2i + 1)
    return x * cos + partner * sin  # (B, H, T, d_k)


def grouped_query_attention(q, k, v, mask):
    batch, heads, t_q, d_k = q.shape
    kv_heads = k.shape[1]
    # query head h = kv head h // groups: the query heads of one group side by side, no copy of k or v
    q = q.reshape(batch, kv_heads, heads // kv_heads, t_q, d_k)  # (B, H_kv, groups, T_q, d_k)
    k, v = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, T_k, d_k): shared by the group
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(d_k)  # (B, H_kv, groups, T_q, T_k)
    if mask is not None:
        scores = np.where(mask[:, :, None], scores, -np.inf)  # (B|1, 1, 1, T_q, T_k)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return (weights @ v).reshape(batch, heads, t_q, d_k)  # (B, H, T_q, d_k)
