"""The performance targets, each judged met / not met from this run's numbers, with what limits it."""

from __future__ import annotations

from typing import Any

# Redesigning the backends to read alike had to keep them fast: torch <= 1.00x nn.Transformer* at
# base and BERT-base, <= 1.10x at tiny (per-call overhead dominates there); JAX <= 1.00x the
# Flax-NNX-built model; nothing slower than before.
TORCH_RATIO, TORCH_TINY_RATIO, JAX_RATIO, NUMPY_RATIO, BERT_RATIO = 1.00, 1.10, 1.00, 1.5, 1.10
BASELINE_RATIO = 1.00
MATMUL_FRACTION = 0.70
COMPILE_S = 3.0
MEMORY_RATIO = 1.5
# SmolLM2-135M generation (tokens/s ours/HF's LlamaForCausalLM.generate, same run):
# every backend >= 1.0x, JAX with its decoding step compiled once in <= 5 s; the model loaded into
# all three backends in one process in < 4 GiB.
SMOLLM2_TORCH, SMOLLM2_JAX, SMOLLM2_NUMPY = 1.0, 1.0, 1.0
SMOLLM2_COMPILE_S = 5.0
SMOLLM2_MEMORY_GIB = 4.0
# ... and at batch 1 every backend decodes at >= 60% of the memory-read limit measured in the same run
# (read rate / weight bytes: a step that only read its weights once).
SMOLLM2_LIMIT_FRACTION = 0.6


def _binding_ratios(rows: list[dict[str, Any]], section: str) -> list[tuple[str, float, str]]:
    """Per (comparison, size): the ratio against the *faster* of the framework's variants
    (torch: its module with and without the fast path), i.e. the stricter comparison."""
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for row in rows:
        if row["section"] != section:
            continue
        key = (row["comparison"], row["size"])
        ratio = row["ratio"]["median"]
        if key not in worst or ratio > worst[key][0]:
            worst[key] = (ratio, row["theirs"])
    return [(f"{comparison}, {size}", ratio, theirs) for (comparison, size), (ratio, theirs) in worst.items()]


def _breakdown_text(breakdown: list[dict[str, Any]], section: str) -> str:
    parts = [
        f"{row['component']}: {row['ratio']['median']:.2f}x {row['theirs']}"
        for row in breakdown
        if row["section"] == section and row["ratio"]["median"] > 1.15
    ]
    return ("components slower than the framework's own (breakdown): " + "; ".join(parts)) if parts else ""


def _ratio_target(name, rows, section, limit, limits_text, tiny_limit=None) -> dict[str, Any] | None:
    """``limit`` for every size, or ``tiny_limit`` at the tiny size when given."""
    measured = _binding_ratios(rows, section)
    if not measured:
        return None

    def limit_of(what: str) -> float:
        return tiny_limit if tiny_limit is not None and what.endswith(", tiny") else limit

    return {
        "target": name,
        "measured": "; ".join(f"{what}: {ratio:.2f}x ({theirs})" for what, ratio, theirs in measured),
        "met": all(ratio <= limit_of(what) for what, ratio, _ in measured),
        "limits": limits_text,
    }


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows, breakdown = results.get("rows", []), results.get("breakdown", [])
    targets = []
    small = "at small sizes (tiny) the time is per-call overhead: Python, input checks, many small ops"
    nested = (
        "on a padded batch nn.TransformerEncoder's fast path packs the real tokens into nested tensors and "
        "skips the padded positions (13.5% of this batch), whose outputs ours computes (they are defined and "
        "held equal across backends): the 'no padding' rows compare the same work"
    )
    torch_limits = "; ".join(filter(None, [_breakdown_text(breakdown, "torch"), nested, small]))
    numpy_limits = "; ".join(filter(None, [_breakdown_text(breakdown, "numpy"), small]))
    jax_limits = (
        "both run as one XLA program; what differs is the attention written out (masked softmax with "
        "-inf fill, isfinite and empty-row guards) against Flax's dot_product_attention"
    )
    for target in (
        _ratio_target(f"torch <= {TORCH_RATIO:.2f}x nn.Transformer / nn.TransformerEncoder, <= "
                      f"{TORCH_TINY_RATIO:.2f}x at tiny (against the faster of fast path on / off)",
                      rows, "torch", TORCH_RATIO, torch_limits, TORCH_TINY_RATIO),
        _ratio_target(f"JAX <= {JAX_RATIO:.2f}x the Flax-NNX-built encoder", rows, "jax", JAX_RATIO, jax_limits),
        _ratio_target(f"NumPy <= {NUMPY_RATIO:.1f}x our torch", rows, "numpy", NUMPY_RATIO, numpy_limits),
        _ratio_target(f"BERT (torch) <= {BERT_RATIO:.2f}x transformers.BertModel (eager and sdpa)",
                      rows, "bert", BERT_RATIO, "; ".join(filter(None, [_breakdown_text(breakdown, "torch"), small]))),
    ):  # fmt: skip
        if target is not None:
            targets.append(target)

    measured = []  # (fraction, text), one per backend: our encoder stack at BERT-base size
    for section in ("torch", "jax", "numpy"):
        row = next(
            (r for r in rows if r["section"] == section and r["size"] == "bert-base"
             and r["comparison"].startswith("encoder stack")), None,
        )  # fmt: skip
        if row is None:
            continue
        text = f"{section} {100 * row['matmul_fraction']:.0f}%"
        if row.get("theirs_matmul_fraction") is not None:
            text += f" ({row['theirs']}: {100 * row['theirs_matmul_fraction']:.0f}%)"
        measured.append((row["matmul_fraction"], text))
    if measured:
        targets.append(
            {
                "target": f"each backend >= {100 * MATMUL_FRACTION:.0f}% of its own 1024^3 matmul rate "
                "at BERT-base size",
                "measured": "; ".join(text for _, text in measured),
                "met": all(fraction >= MATMUL_FRACTION for fraction, _ in measured),
                "limits": "the non-matmul work (softmax over (B, H, T, T), GELU over (B, T, d_ff), LayerNorm, "
                "residual adds) is memory-bound and counted as zero useful FLOPs; smaller, batched matmuls "
                "(per-head q k^T, weights @ v) run below the large-matmul rate",
            }
        )

    models = results.get("compile", {}).get("models", [])
    if models:
        c = models[0]  # the full-depth model, compiled first in its fresh process
        targets.append(
            {
                "target": f"JAX first call of the {c['layers']}-layer model compiles in <= {COMPILE_S:.0f} s",
                "measured": f"compile {c['compile_s']:.2f} s (trace + lower + XLA); "
                f"first call {c['first_call_s']:.2f} s, later calls {c['later_call_s']:.2f} s",
                "met": c["compile_s"] <= COMPILE_S,
                "limits": "the Python loop over layers is unrolled: XLA compiles 12 copies of the layer",
            }
        )

    memory = results.get("memory", {}).get("rows", {})
    if memory:
        targets.append(_memory_target(memory))
    baseline = results.get("baseline")
    if baseline and any("ratio" in row for row in baseline["rows"]):
        targets.append(_baseline_target(baseline))
    if results.get("smollm2"):
        targets += _smollm2_targets(results["smollm2"])
    return targets


def _smollm2_targets(smollm2: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    limits = {
        "torch": "a step is 121 one-row products (memory-bound at batch 1: each step reads all 540 MB of float32 "
        "weights, 113 MB of them the tied output projection): q|k|v and gate|up packed into one matrix each and "
        "every matrix in the layout MKL's one-row product reads fastest (kernels.decoding_layout), in one fused "
        "step (kernels.decode_step); those products read at 21-25 GB/s where one 540 MB product reads up to 30: "
        "each is 1-7 MB, and at that size the start and join of the product's threads and the cold start of "
        "the memory prefetchers are a fifth of its time. Under load every op on torch's two threads waits for a "
        "core another process holds (the 1-thread row)",
        "jax": "XLA's own matrix-vector code: a chain of dependent one-row products reads at 14-16 GB/s, the rate "
        "of one core, whatever the CPU flags (XNNPACK, oneDNN, Eigen's threads off: all 14-16 GB/s, measured), "
        "where MKL and OpenBLAS use both cores (21-25 GB/s); packing q|k|v and gate|up (copies, +278 MB for "
        "SmolLM2) and the output table transposed (+113 MB) cut XLA's calls from 271 to 181, and splitting the "
        "model once per generation saves jax.jit's 8 ms of Python flattening a step",
        "numpy": "OpenBLAS's one-row products, packed and each in its fastest layout (kernels.decoding_layout), in "
        "one fused step (kernels.decode_step); a 576 x 576 product runs on one thread (9-10 GB/s) and the "
        "others at 16-27 GB/s",
    }
    compiles = {c["batch"]: c for c in smollm2.get("fresh_process", {}).get("jax_compile", [])}
    for backend, least in (("torch", SMOLLM2_TORCH), ("jax", SMOLLM2_JAX), ("numpy", SMOLLM2_NUMPY)):
        rows = [r for r in smollm2["rows"] if r["implementation"] == f"ours ({backend})"]
        if not rows:
            continue
        measured = [f"batch {r['batch']}: {r['tokens_per_s_ratio']['median']:.2f}x "
                    f"[{r['tokens_per_s_ratio']['p25']:.2f}-{r['tokens_per_s_ratio']['p75']:.2f}] "
                    f"({r['tokens_per_s']:.1f} tokens/s)" for r in rows]  # fmt: skip
        met = all(r["tokens_per_s_ratio"]["median"] >= least for r in rows)
        name = f"SmolLM2 {backend}: decode tokens/s >= {least:.1f}x HF LlamaForCausalLM.generate's, batch 1 and 8"
        if backend == "jax" and compiles:
            name += (f"; one compiled step for all {smollm2['new_tokens']} positions, "
                     f"compiled in <= {SMOLLM2_COMPILE_S:.0f} s")  # fmt: skip
            for batch, c in compiles.items():
                cpu = c["first_step"].get("cpu_s")
                measured.append(f"batch {batch}: step compile {c['first_step']['compile_s']:.2f} s"
                                + (f" (first step {cpu:.2f} CPU s)" if cpu is not None else "")
                                + f", {c['later_steps_xla_compiles']} compiles after the first step")  # fmt: skip
                met &= c["first_step"]["compile_s"] <= SMOLLM2_COMPILE_S and c["later_steps_xla_compiles"] == 0
        targets.append({"target": name, "measured": "; ".join(measured), "met": met, "limits": limits[backend]})
    limited = [r for r in smollm2["rows"] if r["batch"] == 1 and "fraction_of_limit" in r]
    if limited:
        rate = smollm2["read_rate_gb_s"]["best"]
        default = {f"ours ({backend})" for backend in ("torch", "jax", "numpy")}  # not torch's 1-thread row
        ours = [r for r in limited if r["implementation"] in default]
        targets.append(
            {
                "target": f"SmolLM2 cached greedy at batch 1, float32: every backend >= "
                f"{100 * SMOLLM2_LIMIT_FRACTION:.0f}% of the memory-read limit measured in the same run",
                "measured": f"read rate {rate:.1f} GB/s, {smollm2['weight_bytes'] / 1e6:.0f} MB a step: limit "
                f"{limited[0]['limit_tokens_per_s']:.1f} tokens/s; "
                + "; ".join(f"{r['implementation']}: {100 * r['fraction_of_limit']:.0f}% ({r['tokens_per_s']:.1f} "
                            f"tokens/s; best rounds {100 * r['best_fraction_of_limit']:.0f}%)" for r in limited),
                "met": all(r["fraction_of_limit"] >= SMOLLM2_LIMIT_FRACTION for r in ours),
                "limits": "the read rate is the best of a sum and a matrix-vector product over 540 MB (torch's, "
                "MKL, when it reads fastest); the step's own products are 1-7 MB each and read slower than one "
                "540 MB product (bench.decode_profile: products alone 21-25 GB/s in torch and NumPy, 14-16 in "
                "XLA), and on this shared 2-core machine every thread pool waits for cores other processes hold",
            }
        )  # fmt: skip
    memory = smollm2.get("fresh_process", {}).get("memory")
    if memory:
        peak = memory["peak_mib"] / 1024
        targets.append(
            {
                "target": "SmolLM2 loaded into all three backends in one process: "
                f"peak RSS < {SMOLLM2_MEMORY_GIB:.0f} GiB",
                "measured": f"{peak:.2f} GiB (VmHWM)",
                "met": peak < SMOLLM2_MEMORY_GIB,
                "limits": "each backend holds its own float32 copy of the weights (540 MB), plus the canonical "
                "arrays they were built from",
            }
        )
    return targets


def _baseline_target(baseline: dict[str, Any]) -> dict[str, Any]:
    rows = [row for row in baseline["rows"] if "ratio" in row]
    slower = [row for row in rows if row["ratio"]["median"] > BASELINE_RATIO]
    return {
        "target": f"nothing slower than before the redesign ({baseline['commit']}), same run: "
        f"now / before <= {BASELINE_RATIO:.2f}x",
        "measured": "; ".join(
            f"{row['framework']} {row['comparison']}, {row['size']}: {row['ratio']['median']:.2f}x "
            f"[{row['ratio']['p25']:.2f}-{row['ratio']['p75']:.2f}]"
            for row in rows
        ),
        "met": not slower,
        "limits": "slower than before (median of the per-round ratios; the bracket is their 25th-75th "
        "percentile, a bracket holding 1.00 is within this run's noise): "
        + ", ".join(f"{row['framework']} {row['comparison']}, {row['size']}" for row in slower),
    }


def _memory_target(memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def peak(name):
        row = memory.get(name, {})
        return row.get("peak_increase_mib")

    pairs = [
        ("torch", "torch: ours", ["torch: nn.TransformerEncoder", "torch: nn.TransformerEncoder (fast path off)"]),
        ("jax", "jax: ours", ["jax: Flax NNX layers"]),
        ("numpy", "numpy: ours", ["torch: ours"]),
        ("bert", "bert: ours (torch)", ["bert: HF BertModel (sdpa)"]),
    ]
    measured, met = [], True
    for label, ours, theirs in pairs:
        theirs_peaks = [(peak(name), name) for name in theirs if peak(name)]
        if not peak(ours) or not theirs_peaks:
            continue
        reference, name = min(theirs_peaks)
        ratio = peak(ours) / reference
        met &= ratio <= MEMORY_RATIO
        measured.append(f"{label}: {peak(ours):.0f} / {reference:.0f} MiB = {ratio:.2f}x ({name})")
    return {
        "target": f"peak memory of a forward <= {MEMORY_RATIO}x the framework's own module (NumPy: our torch)",
        "measured": "; ".join(measured),
        "met": met if measured else None,
        "limits": "ours materialises the (B, H, T, T) scores several times over (scale, fill, exp, divide) and "
        "GELU's intermediates over (B, T, d_ff); fused kernels (F.scaled_dot_product_attention, F.gelu, "
        "the fast path's nested tensors) keep one",
    }
