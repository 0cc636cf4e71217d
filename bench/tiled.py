"""``python -m bench.tiled``: one long attention in NumPy, tiled against plain: peak memory and time.

The plain attention (``scaled_dot_product_attention``, written out as the paper writes it) makes
the whole (B, H, T, T) scores, their exponentials and the weights; the tiled one
(``tiled_attention``, FlashAttention's online softmax) makes one (B, H, T, block_size) block at a
time. At B=1, H=8, T=8192, d_k=64 a (B, H, T, T) array is 2 GiB in float32 (4.3 GB in float64, so
the benchmark runs in float32: the plain attention's peak would not fit this machine in float64).

Peak memory: ``tracemalloc`` (NumPy reports its array buffers to it), the peak reset just before
the call; the inputs already exist, the output is counted. Time: the calls interleaved, round after
round, with tracemalloc off (``bench.timing``), the median of the per-round ratios. The
difference of the outputs is reported too (max |tiled - plain| / max |plain|, float32).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from .report import write_latest
from .timing import Budget, Candidate, Ratio, interleaved

RESULTS = os.path.join(os.path.dirname(__file__), "results", "tiled")
SHAPE = {"B": 1, "H": 8, "T": 8192, "d_k": 64}
DTYPE = "float32"
BLOCK_SIZES = (512, 128)  # the fused kernels' TILE_KEYS, and tiled_attention's default
TARGET_MEMORY_RATIO = 0.1  # tiled peak <= 0.1 x plain peak


def peak_mib(fn: Callable[[], Any]) -> tuple[float, Any]:
    """-> (the peak of NumPy's allocations during ``fn()`` in MiB, above what existed before it;
    what ``fn()`` returned)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - before) / 2**20, result


def measure(length: int, heads: int, rounds: int) -> dict[str, Any]:
    from numpy_impl import scaled_dot_product_attention, tiled_attention
    from transformer_backends.tolerances import max_relative_difference

    shape = (SHAPE["B"], heads, length, SHAPE["d_k"])
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))  # (B, H, T, d_k)
    calls = {"plain": lambda: scaled_dot_product_attention(q, k, v)[0]}
    for block_size in BLOCK_SIZES:
        calls[f"tiled, blocks of {block_size}"] = lambda b=block_size: tiled_attention(q, k, v, None, b)[0]
    rows: dict[str, dict[str, Any]] = {}
    plain = None
    for name, call in calls.items():  # one call each under tracemalloc, its output checked
        peak, output = peak_mib(call)
        plain = output if plain is None else plain  # "plain" comes first
        rows[name] = {"peak_mib": peak, "difference_to_plain": max_relative_difference(output, plain)}
        del output
    del plain
    candidates = [Candidate(name, "numpy", call) for name, call in calls.items()]
    times = interleaved(candidates, Budget(min_rounds=rounds, max_rounds=rounds, seconds=0.0))
    for name, seconds in times.items():
        rows[name]["seconds"] = [float(s) for s in seconds]
        rows[name]["median_s"] = float(np.median(seconds))
        rows[name]["memory_ratio"] = rows[name]["peak_mib"] / rows["plain"]["peak_mib"]
        rows[name]["time_ratio"] = Ratio.of(seconds, times["plain"]).to_dict()
    shape = {**SHAPE, "H": heads, "T": length}
    return {"shape": shape, "dtype": DTYPE, "rows": rows, "target_memory_ratio": TARGET_MEMORY_RATIO}


def markdown(results: dict[str, Any]) -> str:
    """The table for docs/performance.md (without a title)."""
    s = results["shape"]
    lines = [
        f"One attention in NumPy at B={s['B']}, H={s['H']}, T={s['T']}, d_k={s['d_k']}, {results['dtype']} "
        f"(no mask), the same inputs; time: median of {len(results['rows']['plain']['seconds'])} interleaved "
        "rounds, the ratio per round; difference: max |tiled - plain| / max |plain|.",
        "",
        "| attention | peak MiB (tracemalloc) | × plain's memory | time s | × plain's time | difference |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in results["rows"].items():
        ratio = row["time_ratio"]
        lines.append(
            f"| {name} | {row['peak_mib']:,.0f} | {row['memory_ratio']:.3f} | {row['median_s']:.2f} | "
            f"{ratio['median']:.2f} ({ratio['p25']:.2f}–{ratio['p75']:.2f}) | {row['difference_to_plain']:.1e} |"
        )
    best = min(row["memory_ratio"] for name, row in results["rows"].items() if name != "plain")
    met = "met" if best <= results["target_memory_ratio"] else "**not met**"
    lines += [
        "",
        f"Target: tiled peak ≤ {results['target_memory_ratio']}× plain's: {met} ({best:.3f}×). Generated from "
        f"`bench/results/tiled/latest.json` ({results['date']}, {results['cpu']}, load {results['load']} at the "
        "start; a shared machine: times swing, ratios within a round hold better).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tiled", description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=SHAPE["T"], help=f"T (default {SHAPE['T']})")
    parser.add_argument(
        "--heads", type=int, default=SHAPE["H"],
        help=f"H (default {SHAPE['H']}); every array of both attentions is H times one head's, so the memory "
        "ratio does not depend on it, and fewer heads fit a machine short of memory",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--out", default=RESULTS, help=f"folder for latest.json and latest.md (default: {RESULTS})")
    args = parser.parse_args(argv)
    from .run import _cpu

    load = os.getloadavg()[0]
    results = measure(args.length, args.heads, args.rounds)
    results |= {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": _cpu() or platform.machine(), "load": f"{load:.1f}"}
    write_latest(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
