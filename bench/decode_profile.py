"""``python -m bench.decode_profile``: where one batch-1 decoding step of SmolLM2-135M goes, in each backend.

The SmolLM2 section of the benchmark (``bench.smollm2``) gives each backend's tokens/s against the
limit of a step that only reads its weights. This profile takes one step apart: the cached greedy
step of a 32-token prompt (``impl.make_stepper``, as ``generate`` runs it, fused kernels on), then
the pieces of that step run alone, at the step's own shapes and with its own weights, each over
every layer:

* the matrix products, as the step makes them (the packed q|k|v and gate|up matrices where the
  stepper packed them, the tied output table), and the read rate they reach: weight bytes / time;
* attention over the cache (the step's kernel: one query row over CACHED positions);
* RMSNorm (two a layer and the final one), the rotary rotation of q's and k's heads, SwiGLU's
  SiLU and product, the residual additions, each as the fused step computes it;
* the cache writes (NumPy and torch grow each layer's keys and values by concatenation);
* the rest, the step's time less all of the above: the framework's and Python's own work (module
  calls, input checks, the mask, the embedding lookup, splitting heads, allocations).

JAX runs the whole step as one compiled program, so its rows are the program's: the products alone
in one program of the same dots, the rest of the program, and what the call costs outside it
(flattening the model's pytree, checks, dispatch). Each time is the median of ``--repeats``
interleaved rounds (``bench.timing``); the read rates of a sum and of the library's matrix-vector
product over 540 MB (``bench.smollm2.memory_read_rate``) are measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .report import write_latest

RESULTS = os.path.join(os.path.dirname(__file__), "results", "decode_profile")
BACKENDS = ("torch", "jax", "numpy")
PROMPT, STEPS = 32, 64  # the cache holds the prompt and up to STEPS new tokens
CACHED = 48  # positions in the cache at the profiled step: the prompt and 16 generated tokens
PARTS = ("products", "attention over the cache", "norms", "rotary", "SwiGLU", "residual additions", "cache writes")


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _steps(impl, model, prompts: np.ndarray) -> tuple[Any, Any, np.ndarray, list[float]]:
    """The stepper after the prompt and CACHED - PROMPT steps -> (stepper, state, tokens, the
    times of the STEPS steps of the whole generation)."""
    stepper = impl.make_stepper(model)
    state = stepper.start(prompts[:, :-1], STEPS)
    tokens, seconds, kept = prompts[:, -1], [], None
    for position in range(STEPS):
        if position == CACHED - PROMPT + 1:
            kept = (state, tokens)
        start = time.perf_counter()
        logits, state = stepper.step(state, tokens, position)
        seconds.append(time.perf_counter() - start)
        tokens = np.asarray(logits).argmax(axis=-1)
    return stepper, kept[0], kept[1], seconds


def _layer_parts(name: str, impl, model) -> dict[str, Callable[[], Any]]:
    """The pieces of one step (NumPy, torch), each a function running it over every layer."""
    config = model.config
    batch, d_model, d_k = 1, config.d_model, config.d_k
    heads, kv_heads = config.num_heads, config.num_kv_heads
    layers = model.decoder.layers
    rng = np.random.default_rng(0)

    def array(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    if name == "torch":
        import torch
        import torch.nn.functional as F

        asarray, cat = torch.from_numpy, torch.cat
        linear = F.linear
        silu = F.silu
        attend = impl.kernels.attention_context
        group = impl.kernels.packed_columns

        def product(x, matrix, bias):  # matrix (in, out), as packed_columns gives it
            return linear(x, matrix.t(), bias)

        def weights(linears):
            packed = group(linears)
            if packed is not None:
                return [packed]
            return [(lin.weight.t(), lin.bias) for lin in linears]

        table = model.tgt_embed.token.weight.detach()  # (V, d_model)

        def logits(x):
            return linear(x, table)
    else:
        asarray = np.asarray

        def cat(parts, dim):
            return np.concatenate(parts, axis=dim)

        def silu(x):
            return x / (1.0 + np.exp(-x))

        def attend(q, k, v, mask):
            return impl.kernels._grouped_attention(q, k, v, mask)

        group = impl.kernels.packed_columns

        def product(x, matrix, bias):
            return impl.kernels._product(x, matrix, bias)

        def weights(linears):
            packed = group(linears)
            if packed is not None:
                return [packed]
            return [(lin.weight, lin.bias) for lin in linears]

        table = model.tgt_embed.token.weight  # (V, d_model)

        def logits(x):
            return x @ table.T

    x = asarray(array(batch, 1, d_model))
    hidden = asarray(array(batch, 1, config.d_ff))
    matrices = []
    for layer in layers:
        attention, ffn = layer.self_attn, layer.ffn
        matrices += weights((attention.w_q, attention.w_k, attention.w_v))
        matrices += weights((attention.w_o,))
        matrices += weights((ffn.w_gate, ffn.w_up))
        matrices += weights((ffn.w_down,))
    inputs = [x if m.shape[0] == d_model else hidden for m, _ in matrices]
    q = asarray(array(batch, heads, 1, d_k))
    k_new = asarray(array(batch, kv_heads, 1, d_k))
    cached = asarray(array(batch, kv_heads, CACHED - 1, d_k))
    keys = asarray(array(batch, kv_heads, CACHED, d_k))
    gate, up = asarray(array(batch, 1, config.d_ff)), asarray(array(batch, 1, config.d_ff))
    norms = [m for layer in layers for m in (layer.self_attn_norm, layer.ffn_norm)] + [model.decoder.norm]
    rotary = layers[0].self_attn.rotary
    rotate = impl.positional.rotate_pairs
    qk = asarray(array(batch, heads + kv_heads, 1, d_k))
    cos, sin = rotary.cos[CACHED : CACHED + 1], rotary.sin[CACHED : CACHED + 1]  # (1, d_k / 2) each

    def products():
        for (matrix, bias), row in zip(matrices, inputs, strict=True):
            product(row, matrix, bias)
        logits(x)

    return {
        "products": products,
        "attention over the cache": lambda: [attend(q, keys, keys, None) for _ in layers],
        "norms": lambda: [impl.kernels._norm(norm, x) for norm in norms],  # as the fused step runs them
        "rotary": lambda: [rotate(qk, cos, sin, rotary.layout) for _ in layers],  # q's and k's heads at once
        "SwiGLU": lambda: [silu(gate) * up for _ in layers],
        "residual additions": lambda: [(x + x, x + x) for _ in layers],
        "cache writes": lambda: [(cat([cached, k_new], 2), cat([cached, k_new], 2)) for _ in layers],
    }, sum(int(np.prod(m.shape)) * 4 for m, _ in matrices) + int(np.prod(table.shape)) * 4


def profile_backend(name: str, impl, model, prompts: np.ndarray, repeats: int) -> dict[str, Any]:
    """One backend's step and its pieces, in milliseconds."""
    stepper, state, tokens, seconds = _steps(impl, model, prompts)
    position = CACHED - PROMPT + 1
    if name == "jax":
        return _profile_jax(impl, model, stepper, state, tokens, position, seconds, repeats)
    import torch

    with torch.inference_mode():
        parts, weight_bytes = _layer_parts(name, impl, model)
        for part in parts.values():  # warm
            part()
        times = {part: 1e3 * _median_time(fn, repeats) for part, fn in parts.items()}
    step_ms = 1e3 * float(np.median(seconds[1:]))
    rest = step_ms - sum(times.values())
    return {"step_ms": step_ms, "parts_ms": times, "rest_ms": rest, "product_bytes": weight_bytes,
            "product_gb_s": weight_bytes / times["products"] / 1e6}  # fmt: skip


def _profile_jax(impl, model, stepper, state, tokens, position, seconds, repeats) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp


    config = model.config
    layers = model.decoder.layers
    matrices = []
    for layer in layers:
        attention, ffn = layer.self_attn, layer.ffn
        for lin in (attention.w_q, attention.w_k, attention.w_v, attention.w_o, ffn.w_gate, ffn.w_up, ffn.w_down):
            matrices.append(lin.kernel[...])
    table = model.tgt_embed.token.weight[...]
    weight_bytes = sum(int(np.prod(m.shape)) * 4 for m in matrices) + int(np.prod(table.shape)) * 4

    @jax.jit
    def products(x, hidden, matrices, table):
        outs = [(x if m.shape[0] == config.d_model else hidden) @ m for m in matrices]
        return outs, x @ table.T

    x = jnp.ones((1, 1, config.d_model), jnp.float32) * 0.1
    hidden = jnp.ones((1, 1, config.d_ff), jnp.float32) * 0.1
    jax.block_until_ready(products(x, hidden, matrices, table))
    product_ms = 1e3 * _median_time(lambda: jax.block_until_ready(products(x, hidden, matrices, table)), repeats)
    ids = jnp.asarray(tokens)[:, None]
    offset = state.offset + position

    split = impl.kernels.split_model(model)

    def program():
        return jax.block_until_ready(
            impl.kernels.compiled_decode_step(*split, ids, state.cache, state.keep, state.memory_mask, offset)
        )

    program()
    program_ms = 1e3 * _median_time(program, repeats)
    step_ms = 1e3 * float(np.median(seconds[1:]))
    return {"step_ms": step_ms,
            "parts_ms": {"products": product_ms, "the rest of the compiled step": program_ms - product_ms},
            "rest_ms": step_ms - program_ms, "product_bytes": weight_bytes,
            "product_gb_s": weight_bytes / product_ms / 1e6}  # fmt: skip


def measure(repeats: int, backends: tuple[str, ...]) -> dict[str, Any]:
    from transformer_backends import get_backend

    from .smollm2 import load_smollm2, make_prompts, memory_read_rate

    config, params, _, tokenizer = load_smollm2()
    prompts = make_prompts(tokenizer, 1)
    weight_bytes = sum(a.nbytes for a in params.values())
    rates = memory_read_rate()
    rows = {}
    for name in backends:
        impl = get_backend(name).impl
        model = impl.build_model(config, params)
        rows[name] = profile_backend(name, impl, model, prompts, repeats)
        del model
    limit_ms = weight_bytes / rates["best"] / 1e6
    for row in rows.values():
        row["fraction_of_limit"] = limit_ms / row["step_ms"]
    return {"read_rate_gb_s": rates, "weight_bytes": weight_bytes, "limit_ms": limit_ms, "cached": CACHED,
            "rows": rows}  # fmt: skip


def _rest(ms: float) -> str:
    """The step less its pieces; below 0 when the pieces, timed apart, took longer than inside the step."""
    return f"{ms:.1f}" if ms >= 0 else f"~0 ({ms:.1f}: the pieces apart took longer)"


def markdown(results: dict[str, Any]) -> str:
    rates = results["read_rate_gb_s"]
    lines = [
        f"One batch-1 step of SmolLM2-135M (float32, {results['cached']} positions cached), fused kernels on, "
        f"as `generate` runs it; each piece alone at the step's shapes, over every layer, in ms. The limit: "
        f"{results['weight_bytes'] / 1e6:.0f} MB of weights at {rates['best']:.1f} GB/s (the best of a sum, "
        f"{max(rates['numpy sum'], rates['torch sum']):.1f}, and the library's matrix-vector product, "
        f"{max(rates['numpy matrix @ vector'], rates['torch vector @ matrix']):.1f}) = "
        f"{results['limit_ms']:.1f} ms.",
        "",
        "| backend | step ms | % of limit | products ms (GB/s) | other pieces ms | the rest ms |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for name, row in results["rows"].items():
        parts = row["parts_ms"]
        others = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items() if part != "products")
        lines.append(
            f"| {name} | {row['step_ms']:.1f} | {100 * row['fraction_of_limit']:.0f}% | "
            f"{parts['products']:.1f} ({row['product_gb_s']:.1f}) | {others} | {_rest(row['rest_ms'])} |"
        )
    lines += ["", f"Generated from `bench/results/decode_profile/latest.json` ({results['date']}, {results['cpu']}, "
              f"load {results['load']} at the start): `python -m bench.decode_profile`."]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timed calls of each piece (default 21)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    parser.add_argument("--out", default=RESULTS, help=f"folder for latest.json and latest.md (default: {RESULTS})")
    args = parser.parse_args(argv)
    from .run import _cpu

    load = os.getloadavg()[0]
    results = measure(args.repeats, tuple(args.backends.split(",")))
    results |= {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": _cpu() or platform.machine(), "load": f"{load:.1f}"}
    write_latest(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
