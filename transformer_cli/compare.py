"""``transformer-ref compare``: one model, one input, every backend, side by side.

Runs the same weights and the same token ids through each installed backend (in
float32 and/or float64), holds every result to the NumPy float64 reference (written out),
and prints the outputs, the largest differences and the times (runs interleaved, medians).

By default each backend runs as users get it, with its fused kernels (``kernels.py``:
torch's F.scaled_dot_product_attention, F.layer_norm, F.gelu, native encoder layer;
NumPy's float32 erf, attention a sequence at a time); ``--kernels written-out`` runs the
teaching code alone (what ``transformer-ref trace`` records), ``--kernels both`` each
side by side. JAX runs jit-compiled, torch eagerly; ``--compile`` runs torch through
torch.compile (its first call then includes the compiling).

Examples:
  transformer-ref compare                          # the tiny encoder-decoder, random ids, every backend
  transformer-ref compare --preset toy-translate   # the shipped toy translator on "she likes fish"
  transformer-ref compare --preset bert-base --dtype float32 --kernels both --backends numpy,torch
  transformer-ref compare --compile --dtype float32 --backends jax,torch
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import numpy as np

from transformer_backends import get_backend

from .compile import add_compile_argument, model_runner, note
from .errors import positive_int
from .help import plain, summary
from .inputs import add_backends_argument, add_model_arguments, chosen_backends, describe, load_model_input
from .threads import add_threads_argument, use_threads


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compare",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.set_defaults(batch=2, length=11)  # a padded batch, T_src != T_tgt
    parser.add_argument(
        "--dtype",
        default="both",
        choices=["float32", "float64", "both"],
        help="the weights' and the computation's float type in each backend (default: both, side by side)",
    )
    add_backends_argument(parser)
    parser.add_argument(
        "--repeat", type=positive_int, default=5, help="timed calls per backend after the first (default: 5)"
    )
    parser.add_argument(
        "--kernels",
        default="fused",
        choices=KERNEL_MODES,
        help="fused (default: each backend's kernels.py, as users run it), written-out (the teaching "
        "code alone, fused kernels off), or both, side by side",
    )
    add_compile_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(run=run)


KERNEL_MODES = ("fused", "written-out", "both")


def run(args: argparse.Namespace) -> int:
    model_input = load_model_input(args)  # float64 weights
    config, params, inputs = model_input.config, model_input.params, model_input.inputs
    dtypes = ["float64", "float32"] if args.dtype == "both" else [args.dtype]
    installed, missing = chosen_backends(args.backends)
    backends = [get_backend(b) for b in installed]
    use_threads(args.threads, installed, sum(v.size for v in params.values()))

    field = "logits" if config.uses_decoder else "last_hidden_state"
    print(describe(model_input))
    shapes = ", ".join(f"{tuple(x.shape)}" for x in inputs)
    print(f"input ids: {shapes}, pad_id {config.pad_id}, seed {args.seed}")
    if model_input.text is not None:
        for tokens in model_input.tokens:
            print(f"input (first row): {' '.join(tokens)}  ({len(tokens)} tokens)")
    if missing:
        print(f"not installed (skipped): {', '.join(missing)}")
    if note(installed, args.compile):
        print(note(installed, args.compile))

    reference = get_backend("numpy")
    with reference.impl.kernels.fused_kernels(False):
        want = getattr(reference.call(reference.impl.build_model(config, params), *inputs), field)
    modes = ["fused", "written-out"] if args.kernels == "both" else [args.kernels]
    print(f"kernels: {' and '.join(modes)}" + ("" if args.kernels == "both" else " (--kernels both: side by side)"))
    runs = [
        Run(b, d, mode, b.impl.build_model(config, _cast(params, d)), _label(b.name, d, mode, len(modes) > 1))
        for b in backends
        for d in dtypes
        for mode in modes
    ]
    for r in runs:  # JAX: one jit-compiled program; torch: eager, or torch.compile with --compile
        r.run = model_runner(r.backend, r.model, args.compile)
    outputs, first, times = {}, {}, {r.label: [] for r in runs}
    for r in runs:  # the first call separately: it includes JAX's compilation (torch's with --compile)
        start = time.perf_counter()
        with r.backend.impl.kernels.fused_kernels(r.mode == "fused"):
            outputs[r.label] = getattr(r.backend.call(r.run, *inputs), field)
        first[r.label] = time.perf_counter() - start
    for _ in range(args.repeat):  # then interleaved, so that a slow minute hits every backend alike
        for r in runs:
            backend_inputs = [r.backend.asarray(x) for x in inputs]
            with r.backend.impl.kernels.fused_kernels(r.mode == "fused"):
                start = time.perf_counter()
                r.backend.synchronize(_forward(r.backend, r.run, backend_inputs))
                times[r.label].append(time.perf_counter() - start)

    scale = float(np.abs(want).max())
    print(f"\n{field} {tuple(want.shape)}, held to the NumPy float64 reference (max |reference| = {scale:.4g})\n")
    kernels_column = f"{'kernels':<12} " if len(modes) > 1 else ""
    header = (
        f"{'backend':<8} {'dtype':<8} {kernels_column}{'max |diff|':>11} {'/ max|ref|':>11} {'first call':>11} "
        f"{'median call':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in runs:
        diff = float(np.abs(outputs[r.label] - want).max())
        median = statistics.median(times[r.label]) if times[r.label] else float("nan")
        mode = f"{r.mode:<12} " if len(modes) > 1 else ""
        print(
            f"{r.backend.name:<8} {r.dtype:<8} {mode}{diff:>11.3e} {diff / scale:>11.3e} {_ms(first[r.label]):>11} "
            f"{_ms(median):>12}"
        )

    width = max(16, *(len(r.label) + 2 for r in runs))
    print(f"\n{field}[0, 0, :6] (the first token), side by side\n")
    print(f"{'':<{width}}" + "".join(f"{v:>12.6f}" for v in want[0, 0, :6]) + "  (reference)")
    for r in runs:
        print(f"{r.label:<{width}}" + "".join(f"{v:>12.6f}" for v in outputs[r.label][0, 0, :6]))

    for d in dtypes:
        labels = [r.label for r in runs if r.dtype == d]
        if len(labels) < 2:
            continue
        names = {label: label.removesuffix(f" {d}").replace(f" {d} ", " ") for label in labels}
        column = max(11, *(len(n) + 2 for n in names.values()))
        print(f"\npairwise max |diff| of {field}, {d}\n")
        print(f"{'':<{column}}" + "".join(f"{names[y]:>{column}}" for y in labels))
        for x in labels:
            row = "".join(f"{float(np.abs(outputs[x] - outputs[y]).max()):>{column}.2e}" for y in labels)
            print(f"{names[x]:<{column}}{row}")
    return 0


@dataclasses.dataclass
class Run:
    backend: Any
    dtype: str
    mode: str  # "fused" | "written-out"
    model: Any
    label: str
    run: Any = None  # what runs the model: model_runner's


def _label(backend: str, dtype: str, mode: str, both: bool) -> str:
    return f"{backend} {dtype}" + (f" {mode}" if both else "")


def _forward(backend, run, inputs):
    if backend.name == "torch":
        with backend.torch.no_grad():
            return run(*inputs)
    return run(*inputs)


def _cast(params: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {k: v.astype(dtype) for k, v in params.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
