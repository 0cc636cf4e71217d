"""Solutions to chapter 14's exercises (decoding): one function per exercise, named as the exercise."""

import numpy as np


def _softmax(scores):
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def kv_cache_step(q, k_new, v_new, k_cache, v_cache, position):
    k_cache[:, :, position : position + 1] = k_new  # append first: the new token attends to itself
    v_cache[:, :, position : position + 1] = v_new
    keys = k_cache[:, :, : position + 1]  # (B, H, position + 1, d_k): the filled slots only
    values = v_cache[:, :, : position + 1]
    weights = _softmax(q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))  # (B, H, 1, position + 1)
    return weights @ values  # (B, H, 1, d_k)


def top_k_filter(logits, k):
    kth_largest = np.sort(logits, axis=-1)[:, -k][:, None]  # (N, 1)
    kept = np.where(logits >= kth_largest, logits, -np.inf)  # ties with the k-th stay
    return _softmax(kept)  # exp(-inf) = 0: renormalised over the kept tokens


def top_p_filter(logits, top_p):
    probs = _softmax(logits)  # (N, V)
    order = np.argsort(-probs, axis=-1, kind="stable")  # most probable first; ties: the lower id first
    ranked = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(ranked, axis=-1) - ranked  # the probability of the tokens ranked above each one
    keep = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(keep, order, above < top_p, axis=-1)  # the token that crosses top_p stays
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)
