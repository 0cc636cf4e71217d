"""One demonstration per classic mistake: the wrong code runs next to ours, on the same input.

Layout of each pitfall: module-level ``wrong_*`` functions (the mistake, as the tutorials
write it, and nothing else changed), ``ours_*`` functions that call the project's real
code, and a registered ``run(backend)``. The page shows ``inspect.getsource`` of the
functions that ran. Where NumPy, JAX and torch spell an operation the same way (``@``,
slicing, ``.swapaxes``, ``.reshape``, comparisons) the wrong code is written once; the few
functions they name differently come from ``ops`` (see ``Ops``). Everything is float64,
seeded, and small: the tiny preset's odd sizes (d_model 36, 3 heads of d_k 12).

Frameworks are imported inside functions only: ``import pitfalls`` needs NumPy alone.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from transformer_spec import Config, init_params, param_schema
from transformer_spec.rope import convert_rope_layout

from .registry import BACKENDS, Demonstration, register, source

CONFIG = Config.preset("tiny")  # d_model 36, num_heads 3, d_k 12, src vocab 53
DTYPE = "float64"  # so that "the same" means 1e-16, and any real difference stands out


class Ops(NamedTuple):
    """The framework functions the backend-neutral wrong code needs, under one name each.

    numpy: ``np.where``, ``scipy.special.softmax(s, axis=-1)``, ``np.arange``;
    jax: ``jnp.where``, ``jax.nn.softmax(s, axis=-1)``, ``jnp.arange``;
    torch: ``torch.where``, ``torch.softmax(s, dim=-1)``, ``torch.arange``.
    Each softmax is the framework's own (max-subtracted), not ours: what the tutorials call.
    """

    where: Callable
    softmax: Callable  # over the last axis
    arange: Callable


def _ops(backend: str) -> Ops:
    if backend == "numpy":
        import scipy.special

        return Ops(np.where, lambda s: scipy.special.softmax(s, axis=-1), np.arange)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        return Ops(jnp.where, lambda s: jax.nn.softmax(s, axis=-1), jnp.arange)
    import torch

    return Ops(torch.where, lambda s: torch.softmax(s, dim=-1), torch.arange)


def _backend(name: str):
    """The adapter (NumPy in, NumPy out) that the CLI and the test suite use; raises
    ModuleNotFoundError when the framework is not installed."""
    from backend_adapters import get_backend

    return get_backend(name)


def _error(call: Callable[[], Any]) -> tuple[str, str]:
    """Run ``call``, which should raise; -> (exception type, message), or ("", "") if it did not."""
    try:
        call()
    except Exception as error:  # each framework raises its own type: report whichever it is
        return type(error).__name__, str(error).splitlines()[0]
    return "", ""


def _g(x: float) -> str:
    return f"{x:.3g}"


# ============================================================================ scale-by-d-model


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


# ====================================================================== one-linear-for-all-heads


def wrong_attention_one_linear_for_all_heads(impl, x, w_q, w_k, w_v, w_o, num_heads):
    batch, seq_len, d_model = x.shape
    heads = x.reshape(batch, seq_len, num_heads, d_model // num_heads).swapaxes(1, 2)  # (B, H, T, d_k): split first
    q, k, v = heads @ w_q, heads @ w_k, heads @ w_v  # (B, H, T, d_k) @ (d_k, d_k): one small matrix for every head
    context, weights = impl.scaled_dot_product_attention(q, k, v)  # (B, H, T, d_k), (B, H, T, T)
    merged = context.swapaxes(1, 2).reshape(batch, seq_len, d_model)  # (B, T, d_model)
    return merged @ w_o, weights  # (B, T, d_model)


def ours_multi_head_attention(backend, config, params, x):
    attention = backend.build("MultiHeadAttention", config, params)  # w_q, w_k, w_v, w_o: (d_model, d_model) each
    return attention(x, x, x, None, True)  # (B, T, d_model), weights (B, H, T, T)


@register(
    "one-linear-for-all-heads",
    "One small Linear(d_k, d_k) shared by all heads",
    BACKENDS,
    tutorials=("from-scratch",),
)
def one_linear_for_all_heads(backend: str) -> Demonstration:
    """The from-scratch tutorial splits x into heads *before* projecting and gives q, k and v one
    nn.Linear(heads_dim, heads_dim) each, applied to every head. So head h only ever sees
    features h*d_k .. (h+1)*d_k - 1 of its input, and all heads share one projection:
    3 d_k^2 weights where the paper has 3 d_model^2 (W_i^Q is d_model x d_k *per head*).
    It is exactly our attention with block-diagonal, tied w_q/w_k/w_v: a special case,
    which training can never leave."""
    b = _backend(backend)
    config = CONFIG.replace(bias=False)  # the from-scratch tutorial's q/k/v Linears have no bias
    d_model, d_k, heads = config.d_model, config.d_k, config.num_heads
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, d_model))  # (B, T, d_model)
    shared = {n: rng.standard_normal((d_k, d_k)) / math.sqrt(d_k) for n in ("w_q", "w_k", "w_v")}  # (d_k, d_k)
    full = init_params(config, seed=2, dtype=DTYPE, component="attention")  # ours: (d_model, d_model) each
    w_o = full["w_o.weight"]

    def wrong(inputs):
        args = [b.asarray(a) for a in (inputs, shared["w_q"], shared["w_k"], shared["w_v"], w_o)]
        return [b.to_numpy(a) for a in wrong_attention_one_linear_for_all_heads(b.impl, *args, heads)]

    def ours(params, inputs):
        return [b.to_numpy(a) for a in ours_multi_head_attention(b, config, params, b.asarray(inputs))]

    # Head 0 of the tutorial's layer reads features 0 .. d_k - 1 only: change every other feature.
    x_moved = x.copy()
    x_moved[..., d_k:] += 1.0
    wrong_out, wrong_w = wrong(x)
    _, wrong_w_moved = wrong(x_moved)
    ours_out, ours_w = ours(full, x)
    _, ours_w_moved = ours(full, x_moved)
    # The tutorial's layer, written as ours: w_q = diag(W, W, W) and so on.
    block_diagonal = {f"{n}.weight": np.kron(np.eye(heads), shared[n]) for n in shared} | {"w_o.weight": w_o}
    as_ours_out, _ = ours(block_diagonal, x)
    schema = param_schema(config, "attention")
    numbers = {
        "wrong_projection_parameters": sum(w.size for w in shared.values()),
        "ours_projection_parameters": sum(math.prod(s) for n, s in schema.items() if not n.startswith("w_o")),
        "wrong_head0_change_from_other_features": float(np.abs(wrong_w_moved[:, 0] - wrong_w[:, 0]).max()),
        "ours_head0_change_from_other_features": float(np.abs(ours_w_moved[:, 0] - ours_w[:, 0]).max()),
        "wrong_vs_ours_block_diagonal": float(np.abs(wrong_out - as_ours_out).max()),
        "max_abs_output_difference": float(np.abs(wrong_out - ours_out).max()),
    }
    return Demonstration(
        pitfall="one-linear-for-all-heads",
        backend=backend,
        wrong_code=source(wrong_attention_one_linear_for_all_heads),
        ours_code=source(ours_multi_head_attention),
        wrong=(
            f"{numbers['wrong_projection_parameters']} q/k/v weights; head 0 blind to features {d_k}.. "
            f"(its weights change by {_g(numbers['wrong_head0_change_from_other_features'])}); equals ours with "
            f"block-diagonal tied weights to {_g(numbers['wrong_vs_ours_block_diagonal'])}"
        ),
        ours=(
            f"{numbers['ours_projection_parameters']} q/k/v weights; every head reads every feature "
            f"(head 0's weights change by {_g(numbers['ours_head0_change_from_other_features'])})"
        ),
        numbers=numbers,
    )


# ===================================================================== layer-norm-unbiased-std


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


# ============================================================================ shared-layer-stack


def wrong_stack_of_one_layer(encoder, container):
    encoder_layer = encoder.layers[0]
    # from-scratch: nn.ModuleList([encoder_layer for _ in range(num_layers)]) -- N references to ONE layer
    encoder.layers = container([encoder_layer for _ in range(len(encoder.layers))])
    return encoder


def ours_encoder(backend, config, params, x):
    encoder = backend.build("Encoder", config, params)  # N EncoderLayer objects, each loaded with its own weights
    return encoder, encoder(x)[0]  # (B, T, d_model)


def _layer_container(backend: str) -> Callable:
    """What a stack of layers lives in: where each framework looks for parameters."""
    if backend == "torch":
        from torch import nn

        return nn.ModuleList
    if backend == "jax":
        from flax import nnx

        return nnx.List
    return list


def _distinct_parameters(module: Any, schema: dict[str, tuple[int, ...]]) -> int:
    """How many weights ``module`` really holds: a schema entry whose owning object (a Linear, a
    LayerNorm) is the same object as another entry's counts once. Works on any backend's modules."""
    sizes = {}
    for name, shape in schema.items():
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        sizes[(id(owner), leaf)] = math.prod(shape)
    return sum(sizes.values())


@register(
    "shared-layer-stack",
    "The same layer object repeated N times in a stack",
    BACKENDS,
    tutorials=("from-scratch",),
)
def shared_layer_stack(backend: str) -> Demonstration:
    """The from-scratch tutorial builds one EncoderLayer and passes it to
    Encoder(encoder_layer, num_layers), which fills its list with that same object N times.
    Every "layer" is one layer: its weights are shared, the model has 1/N of the parameters it prints, and a checkpoint
    with N different layers cannot be loaded into it. Nothing raises: a Python list,
    nn.ModuleList and nnx.List all accept the same object twice (torch and Flax then count
    its parameters once). Each layer must be constructed anew."""
    b = _backend(backend)
    config = CONFIG.replace(num_encoder_layers=3)
    params = init_params(config, seed=4, dtype=DTYPE, component="encoder", nonzero_biases=True)
    x = np.random.default_rng(5).standard_normal((2, 5, config.d_model))  # (B, T, d_model)
    ours, ours_out = ours_encoder(b, config, params, b.asarray(x))
    wrong, _ = ours_encoder(b, config, params, b.asarray(x))  # built the same way, then stacked wrong
    wrong = wrong_stack_of_one_layer(wrong, _layer_container(backend))
    wrong_out = wrong(b.asarray(x))[0]
    schema = param_schema(config, "encoder")
    numbers = {
        "num_layers": config.num_encoder_layers,
        "wrong_distinct_layers": len({id(layer) for layer in wrong.layers}),
        "ours_distinct_layers": len({id(layer) for layer in ours.layers}),
        "wrong_parameters": _distinct_parameters(wrong, schema),
        "ours_parameters": _distinct_parameters(ours, schema),
        "schema_parameters": sum(math.prod(s) for s in schema.values()),
        "max_abs_output_difference": float(np.abs(b.to_numpy(wrong_out) - b.to_numpy(ours_out)).max()),
    }
    return Demonstration(
        pitfall="shared-layer-stack",
        backend=backend,
        wrong_code=source(wrong_stack_of_one_layer),
        ours_code=source(ours_encoder),
        wrong=(
            f"{numbers['num_layers']} layers listed, {numbers['wrong_distinct_layers']} layer object, "
            f"{numbers['wrong_parameters']} parameters; output off by {_g(numbers['max_abs_output_difference'])}"
        ),
        ours=(
            f"{numbers['ours_distinct_layers']} layer objects, {numbers['ours_parameters']} parameters "
            f"(= the weight schema's {numbers['schema_parameters']})"
        ),
        numbers=numbers,
    )


# ========================================================================= dropout-default-half


def wrong_embeddings_with_default_dropout(embeddings, ids):
    from torch import nn

    dropout = nn.Dropout()  # encoder-notebook, from-scratch: p defaults to 0.5; the paper's P_drop is 0.1
    return dropout(embeddings(ids))  # a new module is in training mode: zeroes half, multiplies the rest by 2


def ours_embeddings(embeddings, ids):
    embeddings.eval()  # inference: dropout is the identity (build_model and load_model return this mode)
    return embeddings(ids)  # (B, T, d_model); the rate is the config's, stated (0.1 here, the paper's)


@register(
    "dropout-default-half",
    "nn.Dropout() left at its default p = 0.5",
    ("torch",),
    tutorials=("encoder-notebook", "from-scratch"),
)
def dropout_default_half(backend: str) -> Demonstration:
    """Two tutorials' Embeddings create nn.Dropout() with no argument: p = 0.5, five times the paper's
    P_drop = 0.1. And a torch module starts in training mode, so unless model.eval() is called
    every forward pass, inference included, zeroes a random half of the features and doubles
    the rest: two calls on the same sentence give different embeddings. Only torch has this
    default: Flax's nnx.Dropout has no default rate, and NumPy has no dropout to call."""
    import torch

    b = _backend(backend)
    config = CONFIG.replace(dropout=0.1)
    embeddings = b.build("Embeddings", config, init_params(config, seed=6, dtype=DTYPE, component="embeddings"))
    ids = b.asarray(np.random.default_rng(7).integers(1, config.src_vocab_size, size=(2, 7)))  # (B, T)
    with torch.no_grad(), torch.random.fork_rng():  # seeded, without moving the caller's torch RNG
        torch.manual_seed(0)
        wrong_1 = b.to_numpy(wrong_embeddings_with_default_dropout(embeddings, ids))
        wrong_2 = b.to_numpy(wrong_embeddings_with_default_dropout(embeddings, ids))
        ours_1 = b.to_numpy(ours_embeddings(embeddings, ids))
        ours_2 = b.to_numpy(ours_embeddings(embeddings, ids))
        embeddings.train()  # and in training mode, ours drops its stated 10%
        ours_training = b.to_numpy(embeddings(ids))
    kept = wrong_1 != 0
    numbers = {
        "default_p": torch.nn.Dropout().p,
        "paper_p": 0.1,
        "wrong_zero_fraction": float(1.0 - kept.mean()),
        "wrong_kept_scale": float((wrong_1[kept] / ours_1[kept]).mean()),
        "wrong_repeat_max_difference": float(np.abs(wrong_1 - wrong_2).max()),
        "ours_zero_fraction": float((ours_1 == 0).mean()),
        "ours_repeat_max_difference": float(np.abs(ours_1 - ours_2).max()),
        "ours_training_zero_fraction": float((ours_training == 0).mean()),
    }
    return Demonstration(
        pitfall="dropout-default-half",
        backend=backend,
        wrong_code=source(wrong_embeddings_with_default_dropout),
        ours_code=source(ours_embeddings),
        wrong=(
            f"p = {numbers['default_p']}: {numbers['wrong_zero_fraction']:.0%} of the features zeroed, the rest "
            f"x{_g(numbers['wrong_kept_scale'])}; two calls differ by {_g(numbers['wrong_repeat_max_difference'])}"
        ),
        ours=(
            f"dropout 0.1, stated; in inference mode {numbers['ours_zero_fraction']:.0%} zeroed and two calls "
            f"differ by {_g(numbers['ours_repeat_max_difference'])}; in training mode "
            f"{numbers['ours_training_zero_fraction']:.0%} zeroed"
        ),
        numbers=numbers,
    )


# ============================================================================ neg-inf-mask-nan


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


# ======================================================================= sinusoidal-odd-d-model


def wrong_sinusoidal_table_numpy(max_len, d_model):
    pe = np.zeros((max_len, d_model))
    position = np.arange(0, max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    div_term = np.exp(np.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (ceil(d_model / 2),)
    pe[:, 0::2] = np.sin(position * div_term)  # ceil(d_model / 2) columns: fits
    pe[:, 1::2] = np.cos(position * div_term)  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


def wrong_sinusoidal_table_jax(max_len, d_model):
    import jax.numpy as jnp

    pe = jnp.zeros((max_len, d_model))
    position = jnp.arange(0, max_len, dtype=float)[:, None]  # (max_len, 1)
    div_term = jnp.exp(jnp.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (ceil(d_model / 2),)
    pe = pe.at[:, 0::2].set(jnp.sin(position * div_term))  # ceil(d_model / 2) columns: fits
    pe = pe.at[:, 1::2].set(jnp.cos(position * div_term))  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


def wrong_sinusoidal_table_torch(max_len, d_model):
    import torch

    pe = torch.zeros(max_len, d_model)  # from-scratch's PositionalEncoding.__init__, line for line
    position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)  # (max_len, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)  # ceil(d_model / 2) columns: fits
    pe[:, 1::2] = torch.cos(position * div_term)  # floor(d_model / 2) columns: one too few for an odd d_model
    return pe


WRONG_SINUSOIDAL = {
    "numpy": wrong_sinusoidal_table_numpy,
    "jax": wrong_sinusoidal_table_jax,
    "torch": wrong_sinusoidal_table_torch,
}


def ours_sinusoidal_table(impl, max_len, d_model):
    return impl.sinusoidal_table(max_len, d_model, "float64")  # (max_len, d_model), any d_model


@register(
    "sinusoidal-odd-d-model",
    "The sinusoidal encoding fails for an odd d_model",
    BACKENDS,
    tutorials=("from-scratch",),
)
def sinusoidal_odd_d_model(backend: str) -> Demonstration:
    """The classic table writes sin into the even columns and cos into the odd ones, both from
    the same ceil(d/2) frequencies. For an odd d_model there are ceil(d/2) even columns but only
    floor(d/2) odd ones, so the cos assignment cannot fit: NumPy, JAX and torch all raise. It
    works for every even size, which is why it is copied everywhere. Ours gives the odd columns
    only the first floor(d/2) frequencies, and agrees with the classic code for even d_model."""
    b = _backend(backend)
    wrong, max_len = WRONG_SINUSOIDAL[backend], 6
    error_type, error = _error(lambda: wrong(max_len, 7))
    wrong_even = np.asarray(b.to_numpy(wrong(max_len, 8)), dtype=np.float64)  # (max_len, 8)
    ours_even = b.to_numpy(ours_sinusoidal_table(b.impl, max_len, 8))  # (max_len, 8)
    ours_odd = b.to_numpy(ours_sinusoidal_table(b.impl, max_len, 7))  # (max_len, 7)
    numbers = {
        "wrong_error_type": error_type,
        "wrong_error": error,
        "even_max_difference": float(np.abs(wrong_even - ours_even).max()),
        "ours_odd_shape": tuple(ours_odd.shape),
        "ours_odd_finite": bool(np.isfinite(ours_odd).all()),
    }
    return Demonstration(
        pitfall="sinusoidal-odd-d-model",
        backend=backend,
        wrong_code=source(wrong),
        ours_code=source(ours_sinusoidal_table),
        wrong=f"d_model=7 raises {error_type}: {error}",
        ours=(
            f"d_model=7 gives a {ours_odd.shape} table; d_model=8 equals the classic code to "
            f"{_g(numbers['even_max_difference'])}"
        ),
        numbers=numbers,
        arrays={"ours_odd": ours_odd, "max_len": max_len},
    )


# ========================================================================== decoder-mask-shapes


def wrong_decoder_self_attention_mask(ops, tgt_ids, pad_id):
    tgt_pad = (tgt_ids == pad_id)[:, None, :, None]  # (B, 1, T, 1): llm-notes puts the padding on the *query* axis
    positions = ops.arange(tgt_ids.shape[1])  # (T,)
    causal = (positions[None, :] > positions[:, None])[None, None]  # (1, 1, T, T): torch.triu(ones, diagonal=1)
    return tgt_pad | causal  # (B, 1, T, T), True = blocked: a padded query has every key blocked


def wrong_cross_attention_mask(src_ids, pad_id):
    return (src_ids == pad_id)[:, None, :]  # (B, 1, T_src), from-scratch's src_mask shape; the scores are 4-D


def wrong_attention_finite_fill(ops, q, k, v, blocked):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T_q, T_k)
    scores = ops.where(blocked, -1e9, scores)  # llm-notes: masked_fill(mask, -1e9); broadcasts whatever fits
    weights = ops.softmax(scores)  # a fully blocked row is all -1e9: uniform weights 1 / T_k
    return weights @ v, weights  # (B, H, T_q, d_k)


def ours_decoder_masks(impl, tgt_ids, src_ids, pad_id):
    self_mask = impl.make_decoder_mask(tgt_ids, pad_id)  # (B, 1, T_tgt, T_tgt): causal AND key not padding
    cross_mask = impl.make_cross_attention_mask(src_ids, pad_id)  # (B, 1, 1, T_src): source padding, as keys
    return self_mask, cross_mask  # True = may attend


@register(
    "decoder-mask-shapes",
    "Decoder masks: self-attention vs cross-attention shapes",
    BACKENDS,
    tutorials=("llm-notes", "from-scratch"),
)
def decoder_mask_shapes(backend: str) -> Demonstration:
    """The LLM notes OR a (B, 1, T, 1) target-padding mask into the causal mask: the padding lands on
    the query axis, so each padded query has every key blocked, and with its -1e9 fill such a row
    attends uniformly to all positions, future ones included (with -inf it would be NaN). The
    from-scratch tutorial's author gave up on the decoder's masks: its demo passes a 3-D
    (B, 1, T_src) source mask against 4-D (B, H, T_tgt, T_src) scores, which broadcasts the batch
    axis onto the heads axis: it raises when B != num_heads, and when B == num_heads (8 and 8 in
    its demo) head h silently uses sentence h's padding. Ours: (B, 1, T, T) = causal AND
    key-not-padding for self-attention, (B, 1, 1, T_src) for cross-attention, and any mask that is
    not 4-D is refused."""
    b, ops = _backend(backend), _ops(backend)
    rng = np.random.default_rng(9)
    heads, d_k, pad = CONFIG.num_heads, 4, CONFIG.pad_id
    tgt_ids = np.array([[1, 5, 7, 2, 4], [1, 6, 2, 0, 0], [1, 3, 3, 3, 2]])  # (B=3, T_tgt=5)
    src_ids = np.array([[4, 8, 9, 3, 5, 6, 2], [7, 5, 3, 2, 0, 0, 0], [6, 2, 0, 0, 0, 0, 0]])  # (B=3, T_src=7)
    wrong_self = b.to_numpy(wrong_decoder_self_attention_mask(ops, b.asarray(tgt_ids), pad))  # True = blocked
    wrong_cross = wrong_cross_attention_mask(b.asarray(src_ids), pad)  # (B, 1, T_src), True = blocked
    ours_self, ours_cross = map(b.to_numpy, ours_decoder_masks(b.impl, *map(b.asarray, (tgt_ids, src_ids)), pad))

    # Self-attention: the two masks through attention, on the same q, k, v.
    q, k, v = (rng.standard_normal((3, heads, 5, d_k)) for _ in range(3))  # (B, H, T_tgt, d_k)
    _, wrong_w = wrong_attention_finite_fill(ops, *map(b.asarray, (q, k, v, wrong_self)))
    _, ours_w = ours_attention(b.impl, *map(b.asarray, (q, k, v, ours_self)))
    wrong_w, ours_w = b.to_numpy(wrong_w), b.to_numpy(ours_w)  # (B, H, T_tgt, T_tgt)
    future = np.triu(np.ones((5, 5), dtype=bool), 1)  # (T_q, T_k): key after query
    tgt_real = tgt_ids != pad  # (B, T_tgt)

    # Cross-attention: decoder queries over encoder keys and values.
    q_x = rng.standard_normal((3, heads, 5, d_k))  # (B, H, T_tgt, d_k)
    k_x, v_x = (rng.standard_normal((3, heads, 7, d_k)) for _ in range(2))  # (B, H, T_src, d_k)
    first_two = [b.asarray(a[:2]) for a in (q_x, k_x, v_x)]  # B = 2 != 3 heads
    cross_error_type, cross_error = _error(
        lambda: wrong_attention_finite_fill(ops, *first_two, wrong_cross_attention_mask(b.asarray(src_ids[:2]), pad))
    )
    _, wrong_x_w = wrong_attention_finite_fill(ops, *map(b.asarray, (q_x, k_x, v_x)), wrong_cross)  # B = 3 = heads
    _, ours_x_w = ours_attention(b.impl, *map(b.asarray, (q_x, k_x, v_x, ours_cross)))
    wrong_x_w, ours_x_w = b.to_numpy(wrong_x_w), b.to_numpy(ours_x_w)  # (B, H, T_tgt, T_src)
    src_pad = (src_ids == pad)[:, None, None, :]  # (B, 1, 1, T_src): each sentence's own padding
    keep_3d = b.asarray(src_ids != pad)[:, None, :]  # the tutorial's 3-D shape, with our polarity
    ours_error_type, ours_error = _error(lambda: ours_attention(b.impl, *map(b.asarray, (q_x, k_x, v_x)), keep_3d))

    numbers = {
        "batch": 3,
        "num_heads": heads,
        "wrong_self_mask_shape": tuple(wrong_self.shape),
        "ours_self_mask_shape": tuple(ours_self.shape),
        "wrong_fully_blocked_rows": int(wrong_self.all(-1).sum()),
        "ours_fully_blocked_rows": int((~ours_self).all(-1).sum()),
        "wrong_max_weight_on_future": float(wrong_w[..., future].max()),
        "ours_max_weight_on_future": float(ours_w[..., future].max()),
        "self_real_rows_max_difference": float(np.abs(wrong_w - ours_w).transpose(0, 2, 1, 3)[tgt_real].max()),
        "wrong_cross_mask_shape": tuple(np.shape(b.to_numpy(wrong_cross))),
        "ours_cross_mask_shape": tuple(ours_cross.shape),
        "wrong_cross_error_type_batch_2": cross_error_type,
        "wrong_cross_error_batch_2": cross_error,
        "wrong_cross_max_weight_on_own_padding": float(np.where(src_pad, wrong_x_w, 0.0).max()),
        "ours_cross_max_weight_on_own_padding": float(np.where(src_pad, ours_x_w, 0.0).max()),
        "ours_error_type_for_3d_mask": ours_error_type,
        "ours_error_for_3d_mask": ours_error,
    }
    return Demonstration(
        pitfall="decoder-mask-shapes",
        backend=backend,
        wrong_code=source(wrong_decoder_self_attention_mask, wrong_cross_attention_mask, wrong_attention_finite_fill),
        ours_code=source(ours_decoder_masks, ours_attention),
        wrong=(
            f"self mask {numbers['wrong_self_mask_shape']}: {numbers['wrong_fully_blocked_rows']} fully blocked rows, "
            f"up to {_g(numbers['wrong_max_weight_on_future'])} of a padded query's weight on future positions; "
            f"cross mask {numbers['wrong_cross_mask_shape']}: with batch 2 != {heads} heads raises "
            f"{cross_error_type}, with batch 3 = {heads} heads puts up to "
            f"{_g(numbers['wrong_cross_max_weight_on_own_padding'])} of a weight on the sentence's own padding"
        ),
        ours=(
            f"self mask {numbers['ours_self_mask_shape']}, {numbers['ours_fully_blocked_rows']} fully blocked rows, "
            f"future weight {_g(numbers['ours_max_weight_on_future'])}; cross mask {numbers['ours_cross_mask_shape']}, "
            f"padding weight {_g(numbers['ours_cross_max_weight_on_own_padding'])}; a 3-D mask raises "
            f"{ours_error_type}: {ours_error}"
        ),
        numbers=numbers,
    )


# ====================================================================== jax-clamped-token-ids


def wrong_embedding_lookup(table, ids):
    return table[ids]  # (B, T, d_model): JAX clamps an id past the end to the last row; NumPy and JAX wrap -1


def ours_embedding_lookup(embeddings, ids):
    return embeddings(ids)  # checks every id against [0, vocab_size) first (transformer_spec.checks)


def _rows_read(table: np.ndarray, rows: np.ndarray) -> list[int]:
    """Which row of ``table`` each of ``rows`` is (-1: none, e.g. a NaN row)."""
    found = []
    for row in rows:
        match = np.flatnonzero((table == row).all(-1))
        found.append(int(match[0]) if match.size else -1)
    return found


@register(
    "jax-clamped-token-ids",
    "Out-of-range token ids silently clamped in JAX",
    ("numpy", "jax"),
)
def jax_clamped_token_ids(backend: str) -> Demonstration:
    """JAX never raises on an out-of-range index: table[ids] clamps an id past the end to the last
    row, and a negative id wraps around (nnx.Embed's jnp.take returns a NaN row past the end, but
    still wraps -1). A tokenizer bug or a vocabulary mismatch then yields plausible numbers. NumPy
    raises IndexError past the end but wraps negative ids just as silently (-1, -100: common pad
    and ignore labels). torch's nn.Embedding raises for both. Ours checks every id eagerly, in
    every backend, with one message; inside a user's jax.jit, where values are unknown, our
    lookup gives NaN rows instead of a clamped one."""
    b = _backend(backend)
    config = CONFIG
    params = init_params(config, seed=10, dtype=DTYPE, component="embeddings")
    table = params["token.weight"]  # (src_vocab_size = 53, d_model)
    vocab = config.src_vocab_size
    ids = np.array([[3, vocab, -1]])  # (1, 3): one id past the end, one negative
    embeddings = b.build("Embeddings", config, params)
    numbers: dict[str, Any] = {"vocab_size": vocab, "ids": ids[0].tolist()}
    if backend == "numpy":
        numbers["wrong_error_type"], numbers["wrong_error"] = _error(lambda: wrong_embedding_lookup(table, ids))
        silent_ids = np.array([[3, -1]])  # without the id past the end, NumPy says nothing
    else:
        silent_ids = ids
    looked_up = b.to_numpy(wrong_embedding_lookup(b.asarray(table), b.asarray(silent_ids)))[0]  # (T, d_model)
    numbers["wrong_silent_ids"] = silent_ids[0].tolist()
    numbers["wrong_rows_read"] = _rows_read(table, looked_up)
    numbers["ours_error_type"], numbers["ours_error"] = _error(
        lambda: ours_embedding_lookup(embeddings, b.asarray(ids))
    )
    if backend == "jax":
        import jax

        traced = np.asarray(jax.jit(lambda i: ours_embedding_lookup(embeddings, i))(b.asarray(ids)))[0]  # (T, d_model)
        numbers["ours_jit_nan_rows"] = [bool(np.isnan(row).all()) for row in traced]
    silent = ", ".join(
        f"id {i} -> row {r}" for i, r in zip(silent_ids[0], numbers["wrong_rows_read"], strict=True) if i != 3
    )
    extra = f"; id {vocab} raises {numbers['wrong_error_type']}" if backend == "numpy" else ""
    under_jit = f"; under jax.jit: NaN rows {numbers['ours_jit_nan_rows']}" if backend == "jax" else ""
    return Demonstration(
        pitfall="jax-clamped-token-ids",
        backend=backend,
        wrong_code=source(wrong_embedding_lookup),
        ours_code=source(ours_embedding_lookup),
        wrong=f"silently reads {silent}{extra}",
        ours=f"raises {numbers['ours_error_type']}: {numbers['ours_error']}{under_jit}",
        numbers=numbers,
    )


# ====================================================================== float64-without-x64


def wrong_float64_without_x64():
    import jax.numpy as jnp

    x = np.array([1.0 + 1e-12, 1.0 / 3.0])  # float64
    implicit = jnp.asarray(x)  # float32, not a word said
    explicit = jnp.asarray(x, dtype="float64")  # float32 again, with only a UserWarning
    return implicit, explicit


def ours_float64_without_x64():
    import jax_impl
    from transformer_spec import Config, init_params

    config = Config.preset("tiny")
    return jax_impl.build_model(config, init_params(config, dtype="float64"))  # refuses: TypeError naming x64


def _float64_child() -> None:
    """Runs in a fresh interpreter (see ``float64_without_x64``); prints its findings as JSON."""
    import warnings

    import jax

    jax.config.update("jax_enable_x64", False)  # JAX's default, made explicit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        implicit, explicit = wrong_float64_without_x64()
    error_type, error = _error(ours_float64_without_x64)
    print(
        json.dumps(
            {
                "x64": bool(jax.config.jax_enable_x64),
                "requested_dtype": "float64",
                "wrong_implicit_dtype": str(implicit.dtype),
                "wrong_explicit_dtype": str(explicit.dtype),
                "wrong_warning": str(caught[0].message).split(". ")[0] if caught else "",  # its first sentence
                "input_minus_one": 1e-12,
                "wrong_minus_one": float(explicit[0]) - 1.0,
                "wrong_third_error": abs(float(explicit[1]) - 1.0 / 3.0),
                "ours_error_type": error_type,
                "ours_error": error,
            }
        )
    )


@register("float64-without-x64", "float64 silently truncated to float32 without jax_enable_x64", ("jax",))
def float64_without_x64(backend: str) -> Demonstration:
    """JAX has no float64 unless jax_enable_x64 is set at start-up. Without it, a float64 NumPy
    array becomes float32 silently, and an explicit dtype="float64" request also returns float32,
    with only a warning. A "float64" parity test then compares float32 numbers and its 1e-12
    tolerance fails for no visible reason, or a loosened tolerance hides a real bug. Ours refuses
    float64 weights without x64 with a TypeError that says what to do. (Run in a fresh
    interpreter: the flag is process-wide, and a test session has already turned it on.)"""
    root = Path(__file__).resolve().parents[1]  # the repository: pitfalls/ and jax_impl/ live there
    env = dict(
        os.environ,
        JAX_ENABLE_X64="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [sys.executable, "-c", "from pitfalls.demos import _float64_child; _float64_child()"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    if done.returncode != 0:
        if "ModuleNotFoundError" in done.stderr and "'jax'" in done.stderr:
            raise ModuleNotFoundError("No module named 'jax'", name="jax")
        raise RuntimeError(f"the float64 demonstration's interpreter failed:\n{done.stderr}")
    numbers = json.loads(done.stdout.strip().splitlines()[-1])
    return Demonstration(
        pitfall="float64-without-x64",
        backend=backend,
        wrong_code=source(wrong_float64_without_x64),
        ours_code=source(ours_float64_without_x64),
        wrong=(
            f"asked for float64, got {numbers['wrong_implicit_dtype']} (silently) and "
            f"{numbers['wrong_explicit_dtype']} (warning: {numbers['wrong_warning']}); "
            f"(1 + 1e-12) - 1 = {numbers['wrong_minus_one']}"
        ),
        ours=f"raises {numbers['ours_error_type']}: {numbers['ours_error']}",
        numbers=numbers,
    )


# ======================================================================= rope-layout-mix-up


def wrong_read_gguf_q_k(gguf_params, config):
    # llama.cpp's converter permuted each head's attn_q / attn_k rows for GGML's interleaved pairs (2i, 2i + 1);
    # taken over as they are, and rotated with HF's rotate_half pairs (i, i + d_k/2):
    return dict(gguf_params), config.replace(rope_layout="halves")


def ours_read_gguf_q_k(gguf_params, config):
    from transformer_spec.rope import convert_rope_layout

    file_config = config.replace(rope_layout="interleaved")  # the layout the file's q/k rows are laid out for
    return convert_rope_layout(gguf_params, file_config, to="halves"), config.replace(rope_layout="halves")


@register("rope-layout-mix-up", "RoPE weights read in the other rotary layout", BACKENDS)
def rope_layout_mix_up(backend: str) -> Demonstration:
    """Rotary position embedding rotates pairs of each head's query and key features, and which
    features form a pair is a convention: HF's Llama pairs i with i + d_k/2 ("halves"), GGUF files,
    GGML and GPT-J pair 2i with 2i + 1 ("interleaved"), and a GGUF file's q/k rows are permuted to
    match. Loading such weights into a halves model without undoing that permutation
    (transformer_spec.rope) raises nothing and changes no shape: every pair is rotated at another
    pair's frequency, so the logits are wrong at every position but the first (a token at relative
    distance 0 is not rotated at all), which is why a one-token test passes. On the real
    SmolLM2-135M the mixed-up model still writes fluent text that soon repeats itself (the SmolLM2
    page shows it)."""
    b = _backend(backend)
    config = Config.preset("tiny-llama")  # 9 query heads, 3 kv heads, d_k 6, rotary, halves layout
    hf_params = init_params(config, seed=11, dtype=DTYPE)  # the HF-layout model, as trained
    gguf_params = convert_rope_layout(hf_params, config, "interleaved")  # as llama.cpp writes it to a GGUF file
    ids = np.random.default_rng(12).integers(1, config.tgt_vocab_size, size=(2, 16))  # (B, T)

    def logits_and_scores(config, params):
        model = b.impl.build_model(config, params)
        logits = b.call(model, ids).logits  # (B, T, vocab)
        scores = b.impl.trace_model(model, b.asarray(ids))["decoder.layers.0.self_attn.scores"]  # (B, H, T, T)
        return logits, scores

    reference, reference_scores = logits_and_scores(config, hf_params)
    wrong, wrong_scores = logits_and_scores(*reversed(wrong_read_gguf_q_k(gguf_params, config)))
    ours, _ = logits_and_scores(*reversed(ours_read_gguf_q_k(gguf_params, config)))
    as_file, _ = logits_and_scores(config.replace(rope_layout="interleaved"), gguf_params)  # the file's own layout
    diagonal = np.eye(ids.shape[1], dtype=bool)  # (T_q, T_k): a query and its own key, relative distance 0
    score_difference = np.abs(wrong_scores - reference_scores)  # (B, H, T, T)
    numbers = {
        "d_k": config.d_k,
        "num_heads": config.num_heads,
        "num_kv_heads": config.kv_heads,
        "seq_len": ids.shape[1],
        "max_abs_logit": float(np.abs(reference).max()),
        "wrong_max_abs_logit_difference": float(np.abs(wrong - reference).max()),
        "wrong_first_position_difference": float(np.abs(wrong - reference)[:, 0].max()),
        "wrong_same_next_token": float((wrong.argmax(-1) == reference.argmax(-1)).mean()),
        "wrong_layer0_scores_diagonal_difference": float(score_difference[..., diagonal].max()),
        "wrong_layer0_scores_off_diagonal_difference": float(score_difference[..., ~diagonal].max()),
        "ours_max_abs_logit_difference": float(np.abs(ours - reference).max()),
        "file_layout_max_abs_logit_difference": float(np.abs(as_file - reference).max()),
    }
    return Demonstration(
        pitfall="rope-layout-mix-up",
        backend=backend,
        wrong_code=source(wrong_read_gguf_q_k),
        ours_code=source(ours_read_gguf_q_k),
        wrong=(
            f"logits off by up to {_g(numbers['wrong_max_abs_logit_difference'])} (largest logit "
            f"{_g(numbers['max_abs_logit'])}), the same next token at {numbers['wrong_same_next_token']:.0%} of the "
            f"positions; position 0 off by {_g(numbers['wrong_first_position_difference'])}, layer 0's scores "
            f"equal on the diagonal ({_g(numbers['wrong_layer0_scores_diagonal_difference'])}), off it by up to "
            f"{_g(numbers['wrong_layer0_scores_off_diagonal_difference'])}"
        ),
        ours=(
            f"permuted back, the weights are the HF model's: logits off by "
            f"{_g(numbers['ours_max_abs_logit_difference'])}; "
            f"the file's weights run in the interleaved layout: off by "
            f"{_g(numbers['file_layout_max_abs_logit_difference'])}"
        ),
        numbers=numbers,
    )


# ========================================================================== gqa-repeat-order


def wrong_repeat_kv_numpy(x, groups):
    return np.tile(x, (1, groups, 1, 1))  # (B, H, T, d_k): kv heads 0, 1, 2, 0, 1, 2, ..: head h reads h % H_kv


def wrong_repeat_kv_jax(x, groups):
    import jax.numpy as jnp

    return jnp.tile(x, (1, groups, 1, 1))  # (B, H, T, d_k): kv heads 0, 1, 2, 0, 1, 2, ..: head h reads h % H_kv


def wrong_repeat_kv_torch(x, groups):
    return x.repeat(1, groups, 1, 1)  # (B, H, T, d_k): Tensor.repeat tiles (np.tile); np.repeat is repeat_interleave


WRONG_REPEAT_KV = {"numpy": wrong_repeat_kv_numpy, "jax": wrong_repeat_kv_jax, "torch": wrong_repeat_kv_torch}


def wrong_grouped_query_attention(impl, repeat, q, k, v):
    groups = q.shape[1] // k.shape[1]  # query heads per key/value head
    k, v = repeat(k, groups), repeat(v, groups)  # (B, H_kv, T, d_k) -> (B, H, T, d_k) each
    return impl.scaled_dot_product_attention(q, k, v)  # (B, H, T, d_k), weights (B, H, T, T)


def ours_grouped_query_attention(impl, q, k, v):
    groups = q.shape[1] // k.shape[1]  # query heads per key/value head
    k, v = impl.repeat_kv(k, groups), impl.repeat_kv(v, groups)  # head h reads kv head h // groups
    return impl.scaled_dot_product_attention(q, k, v)  # (B, H, T, d_k), weights (B, H, T, T)


def _kv_head_read(context: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> list[int]:
    """Which key/value head each query head of ``context`` (B, H, T, d_k) attended with: the kv head
    whose NumPy attention reproduces that head's output (-1: none)."""
    read = []
    for head in range(q.shape[1]):
        found = -1
        for kv in range(k.shape[1]):
            scores = q[:, head] @ k[:, kv].swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, T, T)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            if np.abs(weights / weights.sum(-1, keepdims=True) @ v[:, kv] - context[:, head]).max() < 1e-12:
                found = kv
        read.append(found)
    return read


@register("gqa-repeat-order", "Grouped-query attention with the key/value heads tiled, not repeated", BACKENDS)
def gqa_repeat_order(backend: str) -> Demonstration:
    """In grouped-query attention H query heads share H_kv key/value heads, and query head h reads kv
    head h // (H / H_kv): the kv heads must be repeated in place (0, 0, 0, 1, 1, 1, ...), as HF's
    repeat_kv, np.repeat and torch.repeat_interleave do. Tiling them (0, 1, 2, 0, 1, 2, ...: np.tile,
    jnp.tile, and torch's Tensor.repeat, whose name says the opposite) pairs most query heads with
    another group's keys and values; nothing fails, and a model loaded from real weights computes
    nonsense. With H_kv = H (multi-head attention) or H_kv = 1 (multi-query) the two orders are the
    same, which is why a test suite of multi-head configurations never sees the bug."""
    b, wrong_repeat = _backend(backend), WRONG_REPEAT_KV[backend]
    config = Config.preset("tiny-llama")  # 9 query heads in 3 groups of 3, d_k 6
    rng = np.random.default_rng(13)
    numbers: dict[str, Any] = {"num_heads": config.num_heads}
    arrays: dict[str, np.ndarray] = {}
    for label, kv_heads in (("gqa", config.kv_heads), ("mha", config.num_heads), ("mqa", 1)):
        q = rng.standard_normal((2, config.num_heads, 5, config.d_k))  # (B, H, T, d_k)
        k, v = (rng.standard_normal((2, kv_heads, 5, config.d_k)) for _ in range(2))  # (B, H_kv, T, d_k)
        wrong, _ = wrong_grouped_query_attention(b.impl, wrong_repeat, *map(b.asarray, (q, k, v)))
        ours, _ = ours_grouped_query_attention(b.impl, *map(b.asarray, (q, k, v)))
        wrong, ours = b.to_numpy(wrong), b.to_numpy(ours)  # (B, H, T, d_k)
        numbers[f"{label}_kv_heads"] = kv_heads
        numbers[f"{label}_max_abs_difference"] = float(np.abs(wrong - ours).max())
        if label == "gqa":
            numbers["wrong_kv_head_read"] = _kv_head_read(wrong, q, k, v)
            numbers["ours_kv_head_read"] = _kv_head_read(ours, q, k, v)
            numbers["heads_right_by_chance"] = int((np.abs(wrong - ours).max(axis=(0, 2, 3)) == 0).sum())
            arrays = {"q": q, "k": k, "v": v, "wrong": wrong, "ours": ours}
    return Demonstration(
        pitfall="gqa-repeat-order",
        backend=backend,
        wrong_code=source(wrong_repeat, wrong_grouped_query_attention),
        ours_code=source(ours_grouped_query_attention),
        wrong=(
            f"{config.num_heads} query heads over {config.kv_heads} kv heads read kv heads "
            f"{numbers['wrong_kv_head_read']}: output off by up to {_g(numbers['gqa_max_abs_difference'])} "
            f"({numbers['heads_right_by_chance']} heads right by chance); with {config.num_heads} kv heads (MHA) "
            f"off by {_g(numbers['mha_max_abs_difference'])}, with 1 (MQA) by {_g(numbers['mqa_max_abs_difference'])}"
        ),
        ours=f"query heads read kv heads {numbers['ours_kv_head_read']}",
        numbers=numbers,
        arrays=arrays,
    )
