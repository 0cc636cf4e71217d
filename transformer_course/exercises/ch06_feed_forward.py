"""Chapter 6, the feed-forward network: the paper's two linear maps around a ReLU, the gated SwiGLU of Llama,
and the exact GELU."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf
from scipy.special import expit as sigmoid

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake


def _config(d_model: int, d_ff: int, **switches) -> Config:
    return Config.preset("tiny").replace(d_model=d_model, d_ff=d_ff, num_heads=1, **switches)


def _relu(x):
    return np.maximum(x, 0.0)


def _silu(x):
    return x * sigmoid(x)


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


# ------------------------------------------------------------------ feed_forward
def _weights(config: Config, seed: int) -> dict[str, np.ndarray]:
    """The canonical weights of a PositionwiseFeedForward, as the exercise's keyword arguments."""
    p = init_params(config, seed, "float64", "feed_forward", nonzero_biases=True)
    return {"w_1": p["w_1.weight"], "b_1": p["w_1.bias"], "w_2": p["w_2.weight"], "b_2": p["w_2.bias"]}


def _feed_forward_cases():
    rng = np.random.default_rng(60)
    square = {"x": rng.standard_normal((2, 4, 6)), **_weights(_config(6, 6), 61)}
    tiny = {"x": rng.standard_normal((2, 5, 36)), **_weights(_config(36, 37), 62)}
    closed = {"x": rng.standard_normal((1, 1, 8)), **_weights(_config(8, 11), 63)}
    closed["b_1"] = closed["b_1"] - 1.0  # most hidden units below 0: the ReLU sets them to 0
    return [
        ("d_model = d_ff = 6: square weights, where a transposed weight runs without an error", square),
        ("the tiny preset's sizes, d_model 36 and d_ff 37, 2 sentences of 5", tiny),
        ("one position, b_1 lowered by 1: most hidden units cut to 0", closed),
    ]


def _feed_forward_expected(b, x):
    w_1, w_2 = x["w_1"], x["w_2"]
    params = {"w_1.weight": w_1, "w_1.bias": x["b_1"], "w_2.weight": w_2, "w_2.bias": x["b_2"]}
    ffn = b.build("PositionwiseFeedForward", _config(*w_1.shape, activation="relu"), params, "float64")
    return b.call(ffn, x["x"])


# ------------------------------------------------------------------ swiglu
def _swiglu_cases():
    rng = np.random.default_rng(64)
    llama = _config(54, 37, gated_ffn=True, activation="silu", bias=False)  # tiny-llama's sizes
    p = init_params(llama, 65, "float64", "gated_feed_forward")
    wide = init_params(_config(8, 12, gated_ffn=True, activation="silu", bias=False), 66, "float64",
                       "gated_feed_forward")  # fmt: skip
    return [
        ("tiny-llama's sizes: d_model 54, d_ff 37 (narrower than d_model), 2 sentences of 4", {
            "x": rng.standard_normal((2, 4, 54)), "w_gate": p["w_gate.weight"], "w_up": p["w_up.weight"],
            "w_down": p["w_down.weight"]}),
        ("inputs of size 10: gates far below 0 close (SiLU near 0), far above 0 pass the up value", {
            "x": 10.0 * rng.standard_normal((1, 3, 8)), "w_gate": wide["w_gate.weight"],
            "w_up": wide["w_up.weight"], "w_down": wide["w_down.weight"]}),
    ]  # fmt: skip


def _swiglu_expected(b, x):
    d_model, d_ff = x["w_gate"].shape
    config = _config(d_model, d_ff, gated_ffn=True, activation="silu", bias=False)
    params = {"w_gate.weight": x["w_gate"], "w_up.weight": x["w_up"], "w_down.weight": x["w_down"]}
    return b.call(b.build("GatedFeedForward", config, params, "float64"), x["x"])


# ------------------------------------------------------------------ exact_gelu
def _gelu_cases():
    return [
        ("41 points from -5 to 5", {"x": np.linspace(-5.0, 5.0, 41)}),
        ("far out and close to 0, in a (2, 4) array", {"x": np.array([[-40.0, -8.0, -1e-3, 0.0],
                                                                       [1e-3, 0.5, 8.0, 40.0]])}),  # fmt: skip
    ]


EXERCISES = [
    Exercise(
        name="feed_forward",
        chapter="06_feed_forward",
        task="feed_forward(x, w_1, b_1, w_2, b_2) -> (..., d_model): relu(x w_1 + b_1) w_2 + b_2, with x (..., "
        "d_model), w_1 (d_model, d_ff), b_1 (d_ff,), w_2 (d_ff, d_model), b_2 (d_model,): weights stored "
        "[in, out], as the paper writes x W.",
        cases=_feed_forward_cases,
        expected=_feed_forward_expected,
        mistakes=(
            Mistake(
                "the activation after the second linear",
                "The ReLU goes between the two linear maps, on the d_ff hidden units: relu(x w_1 + b_1) w_2 + b_2. "
                "Applied to the output instead, the two maps in a row are one linear map, and the layer's output "
                "can never be negative.",
                lambda x, w_1, b_1, w_2, b_2: _relu((x @ w_1 + b_1) @ w_2 + b_2),
            ),
            Mistake(
                "the weights used as [out, in]",
                "Here (and in the paper) a weight is stored [in, out] and applied as x @ w. torch's nn.Linear "
                "stores the transpose, [out, in], and computes x @ w.T: a line ported from it runs, silently, "
                "wherever the matrix is square. Where it is not (d_model != d_ff), it fails with a shape error.",
                lambda x, w_1, b_1, w_2, b_2: _relu(x @ w_1.T + b_1) @ w_2.T + b_2,
            ),
            Mistake(
                "the activation left out",
                "Without the ReLU the two linear maps are a single one, x (w_1 w_2) + (b_1 w_2 + b_2): the layer "
                "can only rotate and stretch. Apply relu to the hidden units, x @ w_1 + b_1.",
                lambda x, w_1, b_1, w_2, b_2: (x @ w_1 + b_1) @ w_2 + b_2,
            ),
        ),
    ),
    Exercise(
        name="swiglu",
        chapter="06_feed_forward",
        task="swiglu(x, w_gate, w_up, w_down) -> (..., d_model): (silu(x w_gate) * (x w_up)) w_down, silu(z) = z "
        "sigmoid(z); x (..., d_model), w_gate and w_up (d_model, d_ff), w_down (d_ff, d_model); no biases.",
        cases=_swiglu_cases,
        expected=_swiglu_expected,
        mistakes=(
            Mistake(
                "SiLU on the up projection instead of the gate",
                "The activation belongs to the gate, x w_gate: silu(x @ w_gate) * (x @ w_up). The two "
                "projections are not interchangeable, since each weight was trained for its own role "
                "(HF Llama: act_fn(gate_proj(x)) * up_proj(x)).",
                lambda x, w_gate, w_up, w_down: ((x @ w_gate) * _silu(x @ w_up)) @ w_down,
            ),
            Mistake(
                "GELU instead of SiLU",
                "SwiGLU's gate is SiLU (swish), z * sigmoid(z); with GELU, z * Phi(z), it is GeGLU, another "
                "function (activation='gelu' in the config). The two are close but not equal.",
                lambda x, w_gate, w_up, w_down: (_gelu(x @ w_gate) * (x @ w_up)) @ w_down,
            ),
            Mistake(
                "the sigmoid instead of SiLU",
                "SiLU is z * sigmoid(z), not sigmoid(z) alone: sigmoid(x w_gate) * (x w_up) is the original GLU "
                "(Dauphin et al., 2017), whose gate only scales between 0 and 1.",
                lambda x, w_gate, w_up, w_down: (sigmoid(x @ w_gate) * (x @ w_up)) @ w_down,
            ),
        ),
    ),
    Exercise(
        name="exact_gelu",
        chapter="06_feed_forward",
        task="exact_gelu(x) -> the shape of x: x Phi(x) = x (1 + erf(x / sqrt(2))) / 2, with Phi the standard "
        "normal distribution function (scipy.special.erf is imported for you).",
        cases=_gelu_cases,
        expected=lambda b, x: b.call(b.impl.gelu, x["x"]),
        mistakes=(
            Mistake(
                "the tanh approximation",
                "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) is GPT-2's approximation (jax.nn.gelu's default, "
                "torch's approximate='tanh'), up to about 5e-4 off. BERT and torch's nn.GELU() compute the exact "
                "x Phi(x): 0.5 * x * (1 + erf(x / sqrt(2))).",
                lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
            ),
            Mistake(
                "erf(x) instead of erf(x / sqrt(2))",
                "Phi(x) = (1 + erf(x / sqrt(2))) / 2: (1 + erf(x)) / 2 is the distribution function of a normal of "
                "variance 1/2, so the standard normal's needs x / sqrt(2).",
                lambda x: 0.5 * x * (1.0 + erf(x)),
            ),
            Mistake(
                "the sigmoid approximation",
                "x * sigmoid(1.702 x) is an older approximation of GELU, off by up to about 2e-2; the exact one "
                "is x Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))).",
                lambda x: x * sigmoid(1.702 * x),
            ),
        ),
    ),
]
