"""``transformer-ref compare``: one model, one input, every backend, side by side.

Runs the same weights and the same token ids through each installed backend (in
float32 and/or float64), holds every result to the NumPy float64 reference, and prints
the outputs, the largest differences and the times (runs interleaved, medians).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from backend_adapters import get_backend

from .inputs import add_backends_argument, add_model_arguments, chosen_backends, describe, load_model_input


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compare",
        help=__doc__.splitlines()[0],
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.set_defaults(batch=2, length=11)  # a padded batch, T_src != T_tgt
    parser.add_argument("--dtype", default="both", choices=["float32", "float64", "both"])
    add_backends_argument(parser)
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per backend after the first")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model_input = load_model_input(args)  # float64 weights
    config, params, inputs = model_input.config, model_input.params, model_input.inputs
    dtypes = ["float64", "float32"] if args.dtype == "both" else [args.dtype]
    installed, missing = chosen_backends(args.backends)
    backends = [get_backend(b) for b in installed]

    field = "logits" if config.uses_decoder else "last_hidden_state"
    print(describe(model_input))
    shapes = ", ".join(f"{tuple(x.shape)}" for x in inputs)
    print(f"input ids: {shapes}, pad_id {config.pad_id}, seed {args.seed}")
    if args.text is not None:
        for tokens in model_input.tokens:
            print(f"input (first row): {' '.join(tokens)}  ({len(tokens)} tokens)")
    if missing:
        print(f"not installed (skipped): {', '.join(missing)}")

    reference = get_backend("numpy")
    want = getattr(reference.call(reference.impl.build_model(config, params), *inputs), field)
    runs = [(b, d, b.impl.build_model(config, _cast(params, d))) for b in backends for d in dtypes]
    outputs, first, times = {}, {}, {(b.name, d): [] for b, d, _ in runs}
    for b, d, model in runs:  # the first call separately: it includes JAX's compilation
        start = time.perf_counter()
        outputs[b.name, d] = getattr(b.call(model, *inputs), field)
        first[b.name, d] = time.perf_counter() - start
    for _ in range(args.repeat):  # then interleaved, so that a slow minute hits every backend alike
        for b, d, model in runs:
            backend_inputs = [b.asarray(x) for x in inputs]
            start = time.perf_counter()
            b.synchronize(_forward(b, model, backend_inputs))
            times[b.name, d].append(time.perf_counter() - start)

    scale = float(np.abs(want).max())
    print(f"\n{field} {tuple(want.shape)}, held to the NumPy float64 reference (max |reference| = {scale:.4g})\n")
    header = f"{'backend':<8} {'dtype':<8} {'max |diff|':>11} {'/ max|ref|':>11} {'first call':>11} {'median call':>12}"
    print(header)
    print("-" * len(header))
    for b, d, _ in runs:
        diff = float(np.abs(outputs[b.name, d] - want).max())
        median = statistics.median(times[b.name, d]) if times[b.name, d] else float("nan")
        print(f"{b.name:<8} {d:<8} {diff:>11.3e} {diff / scale:>11.3e} {_ms(first[b.name, d]):>11} {_ms(median):>12}")

    print(f"\n{field}[0, 0, :6] (the first token), side by side\n")
    print(f"{'':<16}" + "".join(f"{v:>12.6f}" for v in want[0, 0, :6]) + "  (reference)")
    for b, d, _ in runs:
        print(f"{b.name + ' ' + d:<16}" + "".join(f"{v:>12.6f}" for v in outputs[b.name, d][0, 0, :6]))

    for d in dtypes:
        names = [b.name for b in backends]
        if len(names) < 2:
            continue
        print(f"\npairwise max |diff| of {field}, {d}\n")
        print(f"{'':<8}" + "".join(f"{n:>11}" for n in names))
        for x in names:
            row = "".join(f"{float(np.abs(outputs[x, d] - outputs[y, d]).max()):>11.2e}" for y in names)
            print(f"{x:<8}{row}")
    return 0


def _forward(backend, model, inputs):
    if backend.name == "torch":
        with backend.torch.no_grad():
            return model(*inputs)
    return model(*inputs)


def _cast(params: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {k: v.astype(dtype) for k, v in params.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
