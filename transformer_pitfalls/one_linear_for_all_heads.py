"""The pitfall "one-linear-for-all-heads": One small Linear(d_k, d_k) shared by all heads."""

from __future__ import annotations

import math

import numpy as np

from transformer_spec import init_params, param_schema

from .common import CONFIG, DTYPE, _backend, _g
from .registry import BACKENDS, Demonstration, register, source


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
