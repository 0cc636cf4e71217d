"""The pitfall "layer-norm-unbiased-std": LayerNorm with the unbiased std, and eps added to the std."""

from __future__ import annotations

import numpy as np

from .common import CONFIG, _backend, _g
from .registry import BACKENDS, Demonstration, register, source


def wrong_layer_norm(x, gain, bias, eps):
    mean = x.mean(-1, keepdims=True)  # (..., 1)
    std = x.std(-1, keepdims=True)  # (..., 1): torch divides by d - 1 here (unbiased), NumPy and JAX by d
    return gain * (x - mean) / (std + eps) + bias  # from-scratch: eps added to the std, outside the square root


def ours_layer_norm(backend, config, x):
    d_model = config.d_model
    norm = backend.build("LayerNorm", config, {"weight": np.ones(d_model), "bias": np.zeros(d_model)})
    return norm(x)  # (x - mean) / sqrt(biased var + eps) * weight + bias


@register(
    "layer-norm-unbiased-std",
    "LayerNorm with the unbiased std, and eps added to the std",
    BACKENDS,
    tutorials=("from-scratch",),
)
def layer_norm_unbiased_std(backend: str) -> Demonstration:
    """LayerNorm is (x - mean) / sqrt(var + eps) with the *biased* variance (divide by d): what
    torch, Flax and BERT compute. The from-scratch tutorial writes (x - mean) / (x.std() + eps).
    In torch, x.std() is unbiased (divides by d - 1), so every output is sqrt((d-1)/d) too small; the
    same line in NumPy or JAX is biased, so a translation silently changes meaning. And eps
    added to the std instead of the variance matters where a row barely varies (std near
    sqrt(eps), e.g. a padding position): there the output is several times too large."""
    b = _backend(backend)
    config = CONFIG  # layer_norm_eps 1e-5, torch's default
    rng = np.random.default_rng(3)
    typical = 1.0 + 3.0 * rng.standard_normal(config.d_model)  # an ordinary activation row
    flat = 0.5 + 1e-3 * rng.standard_normal(config.d_model)  # a row that barely varies: var 1e-6 < eps
    x = np.stack([typical, flat])  # (2, d_model)
    ones, zeros = np.ones(config.d_model), np.zeros(config.d_model)
    args = (b.asarray(x), b.asarray(ones), b.asarray(zeros), config.layer_norm_eps)
    wrong = b.to_numpy(wrong_layer_norm(*args))  # (2, d_model)
    ours = b.to_numpy(ours_layer_norm(b, config, b.asarray(x)))  # (2, d_model)
    wrong_std, ours_std = wrong.std(-1), ours.std(-1)  # (2,), NumPy's biased std of each output row
    numbers = {
        "d_model": config.d_model,
        "eps": config.layer_norm_eps,
        "wrong_std_typical": float(wrong_std[0]),
        "ours_std_typical": float(ours_std[0]),
        # (x - mean) / std_wrong has (biased) std sqrt(n / d) when std_wrong divides by n: read n back.
        "wrong_std_divides_by": round(config.d_model * float(wrong_std[0]) ** 2),
        "wrong_std_near_constant": float(wrong_std[1]),
        "ours_std_near_constant": float(ours_std[1]),
        "max_abs_difference_typical": float(np.abs(wrong[0] - ours[0]).max()),
        "max_abs_difference_near_constant": float(np.abs(wrong[1] - ours[1]).max()),
    }
    return Demonstration(
        pitfall="layer-norm-unbiased-std",
        backend=backend,
        wrong_code=source(wrong_layer_norm),
        ours_code=source(ours_layer_norm),
        wrong=(
            f"x.std() divides by {numbers['wrong_std_divides_by']}: output std {_g(wrong_std[0])} on a typical "
            f"row, {_g(wrong_std[1])} on a near-constant row (off by up to "
            f"{_g(numbers['max_abs_difference_near_constant'])})"
        ),
        ours=f"output std {_g(ours_std[0])} on a typical row, {_g(ours_std[1])} on a near-constant row",
        numbers=numbers,
        arrays={"x": x, "wrong": wrong, "ours": ours},
    )
