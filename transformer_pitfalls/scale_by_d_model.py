"""The pitfall "scale-by-d-model": Attention scaled by sqrt(d_model) instead of sqrt(d_k)."""

from __future__ import annotations

import math

import numpy as np

from .common import CONFIG, _backend, _g, _ops
from .registry import BACKENDS, Demonstration, register, source


def wrong_attention_scaled_by_d_model(ops, q, k, v, d_model):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d_model)  # (B, H, T_q, T_k); from-scratch: / embed_size ** (1/2)
    weights = ops.softmax(scores)  # (B, H, T_q, T_k)
    return weights @ v, weights  # (B, H, T_q, d_k)


def ours_attention(impl, q, k, v, mask=None):
    return impl.scaled_dot_product_attention(q, k, v, mask)  # divides by sqrt(q.shape[-1]) = sqrt(d_k)


def _row_std_of_scores(weights: np.ndarray) -> float:
    """The spread of the scores within a row, read back from softmax weights: log w = s - logsumexp(s),
    a per-row shift, so std(log w) over a row is std(s). Mean over rows."""
    return float(np.log(weights).std(axis=-1).mean())


@register(
    "scale-by-d-model",
    "Attention scaled by sqrt(d_model) instead of sqrt(d_k)",
    BACKENDS,
    tutorials=("from-scratch",),
)
def scale_by_d_model(backend: str) -> Demonstration:
    """Dividing the scores by sqrt(d_k) keeps their variance near 1 when q and k have unit-variance
    entries (section 3.2.1): the dot product of two d_k-vectors has variance d_k. The from-scratch
    tutorial divides by sqrt(embed_size) = sqrt(d_model) instead, so every score is sqrt(num_heads)
    times too small: the softmax runs at temperature sqrt(h) and every head's attention is flatter
    than the model the paper describes. Nothing fails; the weights are simply different."""
    b, ops = _backend(backend), _ops(backend)
    rng = np.random.default_rng(0)
    shape = (2, CONFIG.num_heads, 7, CONFIG.d_k)  # (B, H, T, d_k)
    q, k, v = (rng.standard_normal(shape) for _ in range(3))  # unit-variance entries, as the paper assumes
    wrong_out, wrong_w = wrong_attention_scaled_by_d_model(ops, *map(b.asarray, (q, k, v)), CONFIG.d_model)
    ours_out, ours_w = ours_attention(b.impl, *map(b.asarray, (q, k, v)))
    wrong_out, wrong_w, ours_out, ours_w = map(b.to_numpy, (wrong_out, wrong_w, ours_out, ours_w))
    numbers = {
        "d_model": CONFIG.d_model,
        "d_k": CONFIG.d_k,
        "num_heads": CONFIG.num_heads,
        "wrong_score_std": _row_std_of_scores(wrong_w),
        "ours_score_std": _row_std_of_scores(ours_w),
        "wrong_mean_max_weight": float(wrong_w.max(-1).mean()),
        "ours_mean_max_weight": float(ours_w.max(-1).mean()),
        "max_abs_weight_difference": float(np.abs(wrong_w - ours_w).max()),
        "max_abs_output_difference": float(np.abs(wrong_out - ours_out).max()),
    }
    return Demonstration(
        pitfall="scale-by-d-model",
        backend=backend,
        wrong_code=source(wrong_attention_scaled_by_d_model),
        ours_code=source(ours_attention),
        wrong=(
            f"scores spread {_g(numbers['wrong_score_std'])} (ours / sqrt({CONFIG.num_heads})), "
            f"mean top weight {_g(numbers['wrong_mean_max_weight'])}; weights off by up to "
            f"{_g(numbers['max_abs_weight_difference'])}"
        ),
        ours=(f"scores spread {_g(numbers['ours_score_std'])}, mean top weight {_g(numbers['ours_mean_max_weight'])}"),
        numbers=numbers,
        arrays={"q": q, "k": k, "v": v, "wrong_weights": wrong_w, "ours_weights": ours_w},
    )
