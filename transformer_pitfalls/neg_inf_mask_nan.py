"""The pitfall "neg-inf-mask-nan": -inf masks turn fully padded rows into NaN."""

from __future__ import annotations

import math

import numpy as np

from .common import _backend, _g, _ops
from .registry import BACKENDS, Demonstration, register, source


def wrong_attention_neg_inf_fill(ops, q, k, v, query_mask, key_mask):
    mask = query_mask[:, :, None] * key_mask[:, None, :]  # (B, T_q, T_k): 0 on a padded query's whole row
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, T_q, T_k)
    scores = ops.where(mask == 0, -math.inf, scores)  # scores.masked_fill(mask == 0, -float("inf"))
    weights = ops.softmax(scores)  # a padded query's row is all -inf: exp(-inf - (-inf)) = exp(nan)
    return weights @ v  # (B, T_q, d_v)


def ours_attention_with_mask(impl, q, k, v, may_attend):
    context, _ = impl.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], may_attend)  # a head axis
    return context[:, 0]  # (B, T_q, d_v); a row with no allowed key is 0 by definition, not NaN


@register(
    "neg-inf-mask-nan",
    "-inf masks turn fully padded rows into NaN",
    BACKENDS,
    tutorials=("encoder-notebook", "from-scratch", "llm-notes"),
)
def neg_inf_mask_nan(backend: str) -> Demonstration:
    """Masking with -inf gives masked keys a weight of exactly 0, until a row has no allowed key
    at all: softmax then computes exp(-inf - (-inf)) = NaN, in NumPy, JAX and torch alike. The
    encoder notebook and the from-scratch tutorial build their mask as query_mask x key_mask, so
    every padded *query* is such a row. The NaN does not stay there: the next layer gives that
    padded position weight 0, but 0 * NaN is NaN, so every token of the sentence becomes NaN.
    Ours uses -inf too, but defines a row with no allowed key as weights 0 and output 0 (and our
    padding masks hide only keys)."""
    b, ops = _backend(backend), _ops(backend)
    rng = np.random.default_rng(8)
    ids = np.array([[5, 3, 8, 2, 9], [4, 7, 6, 0, 0]])  # (B, T); sentence 1 padded with id 0
    real = (ids != 0).astype(np.float64)  # (B, T): the tutorials' float masks, 1 = real token
    q, k, v = (rng.standard_normal((2, 5, 12)) for _ in range(3))  # (B, T, d_k)
    may_attend = (real[:, :, None] * real[:, None, :] != 0)[:, None]  # (B, 1, T_q, T_k): the same mask, bool
    with np.errstate(invalid="ignore"):  # NumPy warns about the NaN it is about to produce
        wrong_1 = wrong_attention_neg_inf_fill(ops, *map(b.asarray, (q, k, v, real, real)))
        wrong_2 = wrong_attention_neg_inf_fill(ops, wrong_1, wrong_1, wrong_1, *map(b.asarray, (real, real)))
    ours_1 = ours_attention_with_mask(b.impl, *map(b.asarray, (q, k, v, may_attend)))
    ours_2 = ours_attention_with_mask(b.impl, ours_1, ours_1, ours_1, b.asarray(may_attend))
    wrong_1, wrong_2, ours_1, ours_2 = map(b.to_numpy, (wrong_1, wrong_2, ours_1, ours_2))

    def nan_rows(x):
        return int(np.isnan(x).any(-1).sum())

    padded = ids == 0  # (B, T)
    numbers = {
        "positions": int(ids.size),
        "padded_positions": int(padded.sum()),
        "wrong_nan_rows_layer_1": nan_rows(wrong_1),
        "wrong_nan_rows_layer_2": nan_rows(wrong_2),
        "ours_nan_rows_layer_1": nan_rows(ours_1),
        "ours_nan_rows_layer_2": nan_rows(ours_2),
        "ours_padded_rows_max_abs": float(np.abs(ours_1[padded]).max()),
        "real_rows_max_difference_layer_1": float(np.abs(wrong_1[~padded] - ours_1[~padded]).max()),
    }
    return Demonstration(
        pitfall="neg-inf-mask-nan",
        backend=backend,
        wrong_code=source(wrong_attention_neg_inf_fill),
        ours_code=source(ours_attention_with_mask),
        wrong=(
            f"NaN at {numbers['wrong_nan_rows_layer_1']} of {numbers['positions']} positions after one attention "
            f"(the padded ones), at {numbers['wrong_nan_rows_layer_2']} after two "
            "(every token of the padded sentence)"
        ),
        ours=(
            f"NaN at {numbers['ours_nan_rows_layer_1']} and {numbers['ours_nan_rows_layer_2']}; padded rows are 0; "
            f"real rows equal the wrong code's to {_g(numbers['real_rows_max_difference_layer_1'])}"
        ),
        numbers=numbers,
    )
