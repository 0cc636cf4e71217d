"""Chapter 7, layer normalisation and the residual connection: LayerNorm, RMSNorm, post-norm and pre-norm."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake
from .parts import Part


def _config(d_model: int, eps: float = 1e-5) -> Config:
    return Config.preset("tiny").replace(d_model=d_model, num_heads=1, layer_norm_eps=eps)


def _gain(rng: np.random.Generator, d: int) -> np.ndarray:
    return 1.0 + 0.2 * rng.standard_normal(d)  # a learned scale, not all ones: a forgotten weight shows


# ------------------------------------------------------------------ layer_norm
def _layer_norm_cases():
    rng = np.random.default_rng(10)
    ordinary = {"x": 10.0 + 3.0 * rng.standard_normal((2, 5, 8)), "weight": _gain(rng, 8),
                "bias": 0.1 * rng.standard_normal(8), "eps": 1e-5}  # fmt: skip
    flat = np.stack([np.full(6, 2.0), 1.0 + 1e-3 * rng.standard_normal(6), rng.standard_normal(6)])  # (3, 6)
    barely = {"x": flat, "weight": _gain(rng, 6), "bias": 0.1 * rng.standard_normal(6), "eps": 1e-5}
    bert = {"x": rng.standard_normal((2, 4, 6)), "weight": _gain(rng, 6), "bias": 0.1 * rng.standard_normal(6),
            "eps": 1e-12}  # fmt: skip
    return [
        ("(2, 5, 8), mean about 10, eps = 1e-5", ordinary),
        ("rows that barely vary: a constant row, a spread of 1e-3 (std near sqrt(eps)), an ordinary row", barely),
        ("BERT's eps = 1e-12, d = 6", bert),
    ]


def _layer_norm_expected(b, x):
    config = _config(x["x"].shape[-1], x["eps"])
    norm = b.build("LayerNorm", config, {"weight": x["weight"], "bias": x["bias"]}, "float64")
    return b.call(norm, x["x"])


def _normalise(x, weight, bias, eps, ddof=0, eps_outside=False):
    centred = x - x.mean(axis=-1, keepdims=True)
    if eps_outside:
        scale = x.std(axis=-1, ddof=ddof, keepdims=True) + eps
    else:
        scale = np.sqrt(x.var(axis=-1, ddof=ddof, keepdims=True) + eps)
    return centred / scale * weight + bias


# ------------------------------------------------------------------ rms_norm
def _rms_norm_cases():
    rng = np.random.default_rng(11)
    ordinary = {"x": 2.0 + rng.standard_normal((2, 5, 8)), "weight": _gain(rng, 8), "eps": 1e-5}
    small = np.stack([np.zeros(6), 1e-3 * rng.standard_normal(6), rng.standard_normal(6)])  # (3, 6)
    return [
        ("(2, 5, 8), mean about 2, eps = 1e-5", ordinary),
        ("a row of zeros, a row of size 1e-3 (rms near sqrt(eps)), an ordinary row", {"x": small,
         "weight": _gain(rng, 6), "eps": 1e-5}),  # fmt: skip
        ("d = 5, eps = 1e-6", {"x": rng.standard_normal((3, 5)), "weight": _gain(rng, 5), "eps": 1e-6}),
    ]


def _rms_norm_expected(b, x):
    norm = b.build("RMSNorm", _config(x["x"].shape[-1], x["eps"]), {"weight": x["weight"]}, "float64")
    return b.call(norm, x["x"])


# ------------------------------------------------------------------ residual_connection
def _residual_cases():
    rng = np.random.default_rng(12)
    config = _config(8).replace(d_ff=11)

    def part(class_name: str, component: str, seed: int, config: Config = config) -> Part:
        return Part(class_name, config, init_params(config, seed, "float64", component, nonzero_biases=True))

    feed_forward = part("PositionwiseFeedForward", "feed_forward", 1)
    llama = config.replace(gated_ffn=True, activation="silu", bias=False)
    swiglu = part("GatedFeedForward", "gated_feed_forward", 4, llama)  # Llama's sub-layer: another function
    layer_norm, rms_norm = part("LayerNorm", "layer_norm", 2), part("RMSNorm", "rms_norm", 3)
    x = 3.0 * rng.standard_normal((2, 5, 8))
    return [
        ("post-norm (the paper), LayerNorm", {"x": x, "sublayer": feed_forward, "norm": layer_norm,
                                              "norm_first": False}),  # fmt: skip
        ("pre-norm (GPT-2), LayerNorm", {"x": x, "sublayer": feed_forward, "norm": layer_norm, "norm_first": True}),
        ("pre-norm with RMSNorm around SwiGLU (Llama), one position", {"x": 3.0 * rng.standard_normal((1, 1, 8)),
         "sublayer": swiglu, "norm": rms_norm, "norm_first": True}),  # fmt: skip
    ]


def _residual_expected(b, x):
    sublayer, norm = x["sublayer"].build(b), x["norm"].build(b)

    def connection(h):
        return b.impl.sublayer_connection(h, lambda y: (sublayer(y), None), norm, x["norm_first"])[0]

    return b.call(connection, x["x"])


def _swapped(x, sublayer, norm, norm_first):
    return norm(x + sublayer(x)) if norm_first else x + sublayer(norm(x))


def _residual_after_norm(x, sublayer, norm, norm_first):
    if not norm_first:
        return norm(x + sublayer(x))
    h = norm(x)
    return h + sublayer(h)


def _sublayer_output_normalised(x, sublayer, norm, norm_first):
    return x + sublayer(norm(x)) if norm_first else x + norm(sublayer(x))


EXERCISES = [
    Exercise(
        name="layer_norm",
        chapter="07_layer_norm_and_residual",
        task="layer_norm(x, weight, bias, eps) -> the shape of x (..., d): (x - mean) / sqrt(var + eps) * weight + "
        "bias over the last axis, with the biased variance (divide by d).",
        cases=_layer_norm_cases,
        expected=_layer_norm_expected,
        mistakes=(
            Mistake(
                "unbiased variance",
                "LayerNorm divides by d, not d - 1: np.var(x, axis=-1) (ddof=0). torch.var and torch.std divide "
                "by d - 1 by default (NumPy's and JAX's do not), so a line ported from torch changes meaning: "
                "every output comes out sqrt((d - 1) / d) too small.",
                lambda x, weight, bias, eps: _normalise(x, weight, bias, eps, ddof=1),
            ),
            Mistake(
                "eps outside the square root",
                "eps goes under the square root, with the variance: sqrt(var + eps), not std + eps (torch, Flax "
                "and BERT compute the first). Where a row barely varies (std near sqrt(eps)), std + eps is a much "
                "smaller divisor, and the output comes out several times too large.",
                lambda x, weight, bias, eps: _normalise(x, weight, bias, eps, eps_outside=True),
            ),
            Mistake(
                "the PyTorch tutorials' LayerNorm",
                "(x - mean) / (x.std() + eps) with torch's unbiased std: both mistakes at once. Use the biased "
                "variance, and eps inside the square root: (x - mean) / np.sqrt(np.var(x) + eps).",
                lambda x, weight, bias, eps: _normalise(x, weight, bias, eps, ddof=1, eps_outside=True),
            ),
        ),
    ),
    Exercise(
        name="rms_norm",
        chapter="07_layer_norm_and_residual",
        task="rms_norm(x, weight, eps) -> the shape of x (..., d): x / sqrt(mean(x^2) + eps) * weight over the last "
        "axis: no mean subtracted, no bias.",
        cases=_rms_norm_cases,
        expected=_rms_norm_expected,
        mistakes=(
            Mistake(
                "mean subtracted",
                "RMSNorm does not centre: it divides x itself by its root mean square. Subtracting the mean "
                "makes it LayerNorm without a bias, another function (Llama's weights were trained without it).",
                lambda x, weight, eps: _normalise(x, weight, 0.0, eps),
            ),
            Mistake(
                "eps outside the square root",
                "eps goes under the square root: x / sqrt(mean(x^2) + eps), as in LayerNorm and HF's LlamaRMSNorm.",
                lambda x, weight, eps: x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps) * weight,
            ),
            Mistake(
                "the L2 norm instead of the RMS",
                "divide by the root of the *mean* of the squares, not of their sum (np.linalg.norm): the sum is d "
                "times larger, so the output comes out sqrt(d) times too small.",
                lambda x, weight, eps: x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps) * weight,
            ),
        ),
    ),
    Exercise(
        name="residual_connection",
        chapter="07_layer_norm_and_residual",
        task="residual_connection(x, sublayer, norm, norm_first) -> (B, T, d_model): post-norm (norm_first False, "
        "the paper) norm(x + sublayer(x)); pre-norm (True) x + sublayer(norm(x)). sublayer and norm are "
        "functions of one (B, T, d_model) array.",
        cases=_residual_cases,
        expected=_residual_expected,
        mistakes=(
            Mistake(
                "pre- and post-norm swapped",
                "norm_first=True is pre-norm, x + sublayer(norm(x)): the norm comes *first*, on the sublayer's "
                "input. norm_first=False is the paper's post-norm, norm(x + sublayer(x)).",
                _swapped,
            ),
            Mistake(
                "the residual taken after the norm",
                "pre-norm adds the sublayer's output to x itself, not to norm(x): x + sublayer(norm(x)). The "
                "un-normalised path from input to output is the point of pre-norm (an identity for the gradient).",
                _residual_after_norm,
            ),
            Mistake(
                "the sublayer's output normalised instead of the sum",
                "post-norm normalises the *sum*, norm(x + sublayer(x)): the output of every layer is normalised, "
                "residual included. x + norm(sublayer(x)) leaves the residual stream un-normalised.",
                _sublayer_output_normalised,
            ),
        ),
    ),
]
