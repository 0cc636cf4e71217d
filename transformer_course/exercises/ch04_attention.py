"""Chapter 4, attention: the masked softmax and scaled dot-product attention, softmax(q k^T / sqrt(d_k)) v."""

from __future__ import annotations

import math

import numpy as np

from ..check import Exercise, Mistake

PAD = 0


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _causal(seq_len: int) -> np.ndarray:
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))[None, None]  # (1, 1, T, T)


def _decoder_mask(ids: np.ndarray) -> np.ndarray:
    return (ids != PAD)[:, None, None, :] & _causal(ids.shape[1])  # (B, 1, T, T)


def _softmax(scores: np.ndarray, mask: np.ndarray, axis: int = -1) -> np.ndarray:
    """A masked softmax that gives an empty row zeros: the building block of the wrong answers below."""
    scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=axis, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = exp.sum(axis=axis, keepdims=True)
    return exp / np.where(total > 0, total, 1.0)


# ------------------------------------------------------------------ masked_softmax
def _softmax_cases():
    rng = _rng(4)
    causal = {"scores": 2.0 * rng.standard_normal((1, 2, 5, 5)), "mask": _causal(5)}
    ids = np.array([[5, 7, 9, PAD, PAD], [PAD, PAD, 1, 2, 3]])  # right and left padding
    padded = {"scores": 2.0 * rng.standard_normal((2, 2, 5, 5)), "mask": _decoder_mask(ids)}
    large = {
        "scores": 1000.0 + 30.0 * rng.standard_normal((1, 2, 4, 6)),  # exp(1000) overflows float64
        "mask": np.array([True, True, True, True, False, False])[None, None, None, :],  # (1, 1, 1, 6)
    }
    return [
        ("causal mask, 2 heads, T = 5", causal),
        ("left padding: the first two queries of sentence 2 may attend to no key", padded),
        ("large scores, around 1000, two keys padded", large),
    ]


def _softmax_polarity(scores, mask):
    return _softmax(scores, ~mask)


def _softmax_fill_1e9(scores, mask):
    scores = np.where(mask, scores, -1e9)
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def _softmax_nan_row(scores, mask):
    scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        exp = np.exp(scores - scores.max(axis=-1, keepdims=True))  # -inf - -inf = NaN on an empty row
        return exp / exp.sum(axis=-1, keepdims=True)


def _softmax_no_max(scores, mask):
    with np.errstate(over="ignore", invalid="ignore"):
        exp = np.where(mask, np.exp(scores), 0.0)  # exp(1000) = inf
        total = exp.sum(axis=-1, keepdims=True)
        return exp / np.where(total > 0, total, 1.0)  # inf / inf = NaN


# ------------------------------------------------------------------ attention
def _attention_cases():
    rng = _rng(5)
    self_attention = {
        "q": 1.5 * rng.standard_normal((2, 3, 5, 4)),
        "k": 1.5 * rng.standard_normal((2, 3, 5, 4)),
        "v": rng.standard_normal((2, 3, 5, 4)),
        "mask": _causal(5),
        "d_model": 12,  # 3 heads of d_k = 4
    }
    keys_padded = np.array([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]  # (2, 1, 1, 6)
    cross_attention = {
        "q": 1.5 * rng.standard_normal((2, 2, 3, 4)),
        "k": 1.5 * rng.standard_normal((2, 2, 6, 4)),
        "v": rng.standard_normal((2, 2, 6, 5)),
        "mask": keys_padded,
        "d_model": 8,  # 2 heads of d_k = 4
    }
    ids = np.array([[PAD, PAD, 4, 8, 6]])  # left padding
    empty_rows = {
        "q": 1.5 * rng.standard_normal((1, 2, 5, 4)),
        "k": 1.5 * rng.standard_normal((1, 2, 5, 4)),
        "v": rng.standard_normal((1, 2, 5, 4)),
        "mask": _decoder_mask(ids),
        "d_model": 8,
    }
    return [
        ("self-attention, causal, 3 heads of d_k = 4, d_model = 12", self_attention),
        ("cross-attention: 3 queries, 6 keys, d_v = 5, sentence 2's last two keys padded", cross_attention),
        ("left padding: the first two queries may attend to no key", empty_rows),
    ]


def _attention_scaled(q, k, v, mask, scale, axis=-1):
    scores = q @ k.swapaxes(-1, -2) / scale  # (B, H, T_q, T_k)
    return _softmax(scores, mask, axis) @ v  # (B, H, T_q, d_v)


EXERCISES = [
    Exercise(
        name="masked_softmax",
        chapter="04_attention",
        task="masked_softmax(scores, mask) -> weights, the shape of scores (..., T_q, T_k): the softmax over the "
        "last axis of the allowed keys only (mask True = may attend, broadcast against scores); 0 at masked keys, "
        "and all zeros in a row with no allowed key.",
        cases=_softmax_cases,
        expected=lambda b, x: b.call(b.impl.masked_softmax, x["scores"], x["mask"]),
        mistakes=(
            Mistake(
                "the mask's polarity",
                "True means *may attend*: keep the scores where the mask is True, np.where(mask, scores, -np.inf) "
                "(torch.nn.Transformer's masks read True as *hidden*, the other way round).",
                _softmax_polarity,
            ),
            Mistake(
                "a -1e9 fill",
                "a finite fill leaves a row with no allowed key all equal (-1e9 everywhere), so its softmax is the "
                "uniform average over padding instead of zeros. Fill with -np.inf and give an empty row zeros: "
                "replace its row max (-inf) by 0 and divide by 1 where the row's sum is 0.",
                _softmax_fill_1e9,
            ),
            Mistake(
                "NaN on a fully masked row",
                "with a -inf fill, a row with no allowed key computes exp(-inf - (-inf)) = exp(NaN) and 0 / 0: NaN "
                "(torch.softmax does this too), and a NaN spreads through the next matrix product. Replace the row "
                "max by 0 where it is -inf, and divide by 1 where the row's sum is 0.",
                _softmax_nan_row,
            ),
            Mistake(
                "no max subtraction",
                "exp(1000) overflows float64 to inf, and inf / inf is NaN. Subtract each row's max (over the allowed "
                "keys) before np.exp: softmax(s) = softmax(s - c) for any c, and then every exponent is <= 0.",
                _softmax_no_max,
            ),
        ),
    ),
    Exercise(
        name="attention",
        chapter="04_attention",
        task="attention(q, k, v, mask, d_model) -> context (B, H, T_q, d_v) = softmax(q k^T / sqrt(d_k)) v, with "
        "q (B, H, T_q, d_k), k (B, H, T_k, d_k), v (B, H, T_k, d_v), mask bool broadcastable to (B, H, T_q, T_k) "
        "(True = may attend) and d_model = H * d_k, the width of the model the heads were cut from.",
        cases=_attention_cases,
        expected=lambda b, x: b.call(b.impl.scaled_dot_product_attention, x["q"], x["k"], x["v"], x["mask"])[0],
        mistakes=(
            Mistake(
                "sqrt(d_model) for sqrt(d_k)",
                "the scale is the per-head size d_k = q.shape[-1], not d_model: a dot product of two d_k-vectors "
                "with unit-variance entries has variance d_k. Dividing by sqrt(d_model) makes every score "
                "sqrt(H) times too small, and every head's attention flatter than the paper's.",
                lambda q, k, v, mask, d_model: _attention_scaled(q, k, v, mask, math.sqrt(d_model)),
            ),
            Mistake(
                "no scaling",
                "divide the scores by sqrt(d_k) = sqrt(q.shape[-1]) before the softmax: without it their spread "
                "grows like sqrt(d_k) and the softmax saturates towards one key (section 3.2.1 of the paper).",
                lambda q, k, v, mask, d_model: _attention_scaled(q, k, v, mask, 1.0),
            ),
            Mistake(
                "softmax over the queries",
                "each query's weights sum to 1 over the *keys*: the softmax runs over the last axis (T_k) of the "
                "(B, H, T_q, T_k) scores, not over axis -2 (T_q).",
                lambda q, k, v, mask, d_model: _attention_scaled(q, k, v, mask, math.sqrt(q.shape[-1]), axis=-2),
            ),
        ),
    ),
]
