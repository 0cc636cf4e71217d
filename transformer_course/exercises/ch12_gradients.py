"""Chapter 12, gradients: backward passes written by hand, held to NumPy's hand-written backward and to
torch.autograd and jax.grad run through each backend's own forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_spec import Config

from ..check import Exercise, Mistake

PAD = 0


def _vjp(b, forward: Callable[[Any], Any], x: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """d(sum(forward(x) * grad_output)) / dx by the framework's autograd (torch or JAX), as NumPy."""
    if b.name == "torch":
        import torch

        with torch.enable_grad():
            leaf = b.asarray(x).requires_grad_()
            (grad,) = torch.autograd.grad(forward(leaf), leaf, b.asarray(grad_output))
        return b.to_numpy(grad)
    import jax

    _, pullback = jax.vjp(forward, b.asarray(x))
    return b.to_numpy(pullback(b.asarray(grad_output))[0])


# ------------------------------------------------------------------ layer_norm_backward
def _norm_config(d_model: int, eps: float) -> Config:
    return Config.preset("tiny").replace(d_model=d_model, num_heads=1, layer_norm_eps=eps, bias=False)


def _layer_norm_cases():
    rng = np.random.default_rng(20)

    def case(x, eps):
        d = x.shape[-1]
        return {"x": x, "weight": 1.0 + 0.2 * rng.standard_normal(d), "eps": eps,
                "grad_output": rng.standard_normal(x.shape)}  # fmt: skip

    flat = np.stack([np.full(6, 2.0), 1.0 + 1e-3 * rng.standard_normal(6), rng.standard_normal(6)])  # (3, 6)
    return [
        ("(2, 5, 8), mean about 10, eps = 1e-5", case(10.0 + 3.0 * rng.standard_normal((2, 5, 8)), 1e-5)),
        ("rows that barely vary: a constant row, a spread of 1e-3, an ordinary row", case(flat, 1e-5)),
        ("BERT's eps = 1e-12, d = 6", case(rng.standard_normal((2, 4, 6)), 1e-12)),
    ]


def _layer_norm_expected(b, x):
    norm = b.build("LayerNorm", _norm_config(x["x"].shape[-1], x["eps"]), {"weight": x["weight"]}, "float64")
    if b.name == "numpy":  # the hand-written backward, after a forward that kept what it needs
        from numpy_impl.module import enable_grad

        with enable_grad():
            norm(x["x"])
        return norm.backward(x["grad_output"])[0]
    return _vjp(b, norm, x["x"], x["grad_output"])


def _normalised(x, eps):
    mean = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mean) / std, std


def _ln_constants(x, weight, eps, grad_output):
    _, std = _normalised(x, eps)
    return grad_output * weight / std


def _ln_variance_constant(x, weight, eps, grad_output):
    _, std = _normalised(x, eps)
    g = grad_output * weight
    return (g - g.mean(axis=-1, keepdims=True)) / std


def _ln_mean_term_missing(x, weight, eps, grad_output):
    x_hat, std = _normalised(x, eps)
    g = grad_output * weight
    return (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std


def _ln_weight_forgotten(x, weight, eps, grad_output):
    x_hat, std = _normalised(x, eps)
    g = grad_output
    return (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std


# ------------------------------------------------------------------ softmax_backward
def _softmax_cases():
    rng = np.random.default_rng(21)
    ids = np.array([[5, 7, 9, PAD, PAD], [PAD, PAD, 1, 2, 3]])  # right and left padding
    causal = np.tril(np.ones((5, 5), dtype=bool))[None, None]
    decoder = (ids != PAD)[:, None, None, :] & causal  # (2, 1, 5, 5): sentence 2's first two rows see no key
    return [
        ("no key masked, 2 heads, 4 queries, 6 keys",
         {"scores": 2.0 * rng.standard_normal((1, 2, 4, 6)), "mask": np.ones((1, 1, 1, 6), dtype=bool),
          "grad_weights": rng.standard_normal((1, 2, 4, 6))}),
        ("causal and padding: two query rows with no key at all",
         {"scores": 2.0 * rng.standard_normal((2, 2, 5, 5)), "mask": decoder,
          "grad_weights": rng.standard_normal((2, 2, 5, 5))}),
    ]  # fmt: skip


def _softmax_expected(b, x):
    scores, mask, grad = x["scores"], x["mask"], x["grad_weights"]
    if b.name == "numpy":  # the hand-written backward, from the forward's weights
        from numpy_impl.attention import masked_softmax_backward

        return masked_softmax_backward(b.impl.masked_softmax(scores, mask), grad)
    return _vjp(b, lambda s: b.impl.masked_softmax(s, b.asarray(mask)), scores, grad)


def _weights(scores, mask):
    scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = exp.sum(axis=-1, keepdims=True)
    return exp / np.where(total > 0, total, 1.0)


def _sm_diagonal(scores, mask, grad_weights):
    s = _weights(scores, mask)
    return s * (1.0 - s) * grad_weights


def _sm_unweighted_sum(scores, mask, grad_weights):
    s = _weights(scores, mask)
    return s * (grad_weights - grad_weights.sum(axis=-1, keepdims=True))


def _sm_queries_axis(scores, mask, grad_weights):
    s = _weights(scores, mask)
    return s * (grad_weights - (grad_weights * s).sum(axis=-2, keepdims=True))


# ------------------------------------------------------------------ linear_weight_grad
def _linear_cases():
    rng = np.random.default_rng(22)
    return [
        ("x (2, 3, 4), d_out = 5",
         {"x": rng.standard_normal((2, 3, 4)), "grad_output": rng.standard_normal((2, 3, 5))}),
        ("one position: x (1, 1, 3), d_out = 2",
         {"x": rng.standard_normal((1, 1, 3)), "grad_output": rng.standard_normal((1, 1, 2))}),
        ("x (4, 2, 6), d_out = 3",
         {"x": rng.standard_normal((4, 2, 6)), "grad_output": rng.standard_normal((4, 2, 3))}),
    ]  # fmt: skip


def _linear_expected(b, x):
    d_in, d_out = x["x"].shape[-1], x["grad_output"].shape[-1]
    linear = b.impl.Linear(d_in, d_out, True, "float64")  # weight zeros: dW does not depend on W
    if b.name == "numpy":  # the hand-written backward
        from numpy_impl.module import enable_grad

        with enable_grad():
            linear(x["x"])
        return linear.backward(x["grad_output"])[1]["weight"]
    if b.name == "torch":  # nn.Linear's weight is [out, in]: its gradient too, transposed to [in, out]
        import torch

        with torch.enable_grad():
            output = linear(b.asarray(x["x"]))
            (grad,) = torch.autograd.grad(output, linear.weight, b.asarray(x["grad_output"]))
        return b.to_numpy(grad).T
    from flax import nnx  # nnx.Linear's kernel is [in, out], the canonical layout

    grads = nnx.grad(lambda module: (module(b.asarray(x["x"])) * b.asarray(x["grad_output"])).sum())(linear)
    return b.to_numpy(grads["kernel"][...])


def _rows(x, grad_output):
    return x.reshape(-1, x.shape[-1]), grad_output.reshape(-1, grad_output.shape[-1])


def _lin_transposed(x, grad_output):
    rows_x, rows_g = _rows(x, grad_output)
    return rows_g.T @ rows_x  # (d_out, d_in)


def _lin_not_summed(x, grad_output):
    return x.swapaxes(-1, -2) @ grad_output  # (B, d_in, d_out): one gradient per sequence


def _lin_mean(x, grad_output):
    rows_x, rows_g = _rows(x, grad_output)
    return rows_x.T @ rows_g / rows_x.shape[0]


EXERCISES = [
    Exercise(
        name="layer_norm_backward",
        chapter="12_gradients",
        task="layer_norm_backward(x, weight, eps, grad_output) -> grad_x, the shape of x (..., d): the gradient "
        "of sum(LayerNorm(x) * grad_output) with respect to x, for LayerNorm(x) = (x - mean) / sqrt(var + eps) "
        "* weight over the last axis (biased variance). NumPy's answer is its hand-written LayerNorm.backward; "
        "torch's and JAX's, autograd through their own LayerNorm.",
        cases=_layer_norm_cases,
        expected=_layer_norm_expected,
        mistakes=(
            Mistake(
                "mean and variance treated as constants",
                "The mean and the variance are functions of every x of the row, so each x_i reaches the output "
                "through them too. With g = grad_output * weight and x_hat the normalised x: grad_x = (g - "
                "mean(g) - x_hat * mean(g * x_hat)) / sqrt(var + eps), the means over the last axis.",
                _ln_constants,
            ),
            Mistake(
                "the variance treated as a constant",
                "The mean's term (- mean(g)) is there, the variance's is missing: x_i also changes the variance, "
                "which gives the term - x_hat * mean(g * x_hat). grad_x = (g - mean(g) - x_hat * mean(g * x_hat)) "
                "/ sqrt(var + eps).",
                _ln_variance_constant,
            ),
            Mistake(
                "the mean's term missing (RMSNorm's backward)",
                "(g - x_hat * mean(g * x_hat)) / std is RMSNorm's gradient, which has no mean. LayerNorm "
                "subtracts the mean, and that gives the term - mean(g): grad_x = (g - mean(g) - x_hat * "
                "mean(g * x_hat)) / sqrt(var + eps).",
                _ln_mean_term_missing,
            ),
            Mistake(
                "the weight forgotten",
                "The output is x_hat * weight, so the gradient that reaches x_hat is grad_output * weight: "
                "multiply by the weight first, then apply the normalisation's backward.",
                _ln_weight_forgotten,
            ),
        ),
    ),
    Exercise(
        name="softmax_backward",
        chapter="12_gradients",
        task="softmax_backward(scores, mask, grad_weights) -> grad_scores, the shape of scores (..., T_q, T_k): "
        "the gradient of sum(masked_softmax(scores, mask) * grad_weights) with respect to the scores, the "
        "softmax over the last axis of the allowed keys (mask True = may attend, broadcast against scores; a "
        "row with no allowed key has all-zero weights). NumPy's answer is its hand-written "
        "masked_softmax_backward; torch's and JAX's, autograd through their own masked_softmax.",
        cases=_softmax_cases,
        expected=_softmax_expected,
        mistakes=(
            Mistake(
                "the diagonal only, s(1 - s)",
                "Each weight s_j depends on every score of its row: d s_j / d z_i = s_j ([i = j] - s_i). "
                "s (1 - s) is only the diagonal of that Jacobian; with the rest, grad_z = s * (g - sum(g * s)), "
                "the sum over the row (the last axis).",
                _sm_diagonal,
            ),
            Mistake(
                "the row's sum without the weights",
                "The off-diagonal terms give - s_j * sum_i g_i s_i: a sum of g weighted by s, not of g alone. "
                "grad_z = s * (g - (g * s).sum(axis=-1, keepdims=True)).",
                _sm_unweighted_sum,
            ),
            Mistake(
                "the sum over the queries",
                "A query's weights form one softmax over the keys (the last axis): the sum in "
                "s * (g - sum(g * s)) runs over axis -1, not axis -2.",
                _sm_queries_axis,
            ),
        ),
    ),
    Exercise(
        name="linear_weight_grad",
        chapter="12_gradients",
        task="linear_weight_grad(x, grad_output) -> grad_weight (d_in, d_out): the gradient of sum((x @ W + b) "
        "* grad_output) with respect to W (stored [in, out], as in numpy_impl), for x (..., d_in) and "
        "grad_output (..., d_out). NumPy's answer is its hand-written Linear.backward; torch's and JAX's, "
        "autograd through nn.Linear and nnx.Linear (torch's [out, in] gradient transposed).",
        cases=_linear_cases,
        expected=_linear_expected,
        mistakes=(
            Mistake(
                "the transpose, g^T x",
                "For y = x W with W [in, out], dW = x^T g, of shape (d_in, d_out) like W. g^T x is the gradient of "
                "torch's [out, in] weight, the transpose.",
                _lin_transposed,
            ),
            Mistake(
                "not summed over the batch",
                "Every position of every sequence used the same W, so its gradient is the sum of x_t^T g_t over "
                "all of them: reshape x to (N, d_in) and g to (N, d_out), then x^T g. A batched matmul keeps "
                "one gradient per sequence.",
                _lin_not_summed,
            ),
            Mistake(
                "the mean over the positions",
                "The loss already took its mean (the 1 / N is in grad_output): dW is the plain sum x^T g over "
                "the positions, not divided again by their number.",
                _lin_mean,
            ),
        ),
    ),
]
