"""``python -m bench.lm_training [--quick] [--out bench/results/training]``: training speed and memory
of the Shakespeare language model (transformer_text.corpus.config(): the modern decoder, 4 layers,
d_model 64, 2,258-token vocabulary) in every backend: float32 and bf16 mixed precision, on one
device and data parallel over 2 replicas; with the machine's GEMM rate for context, and the peak
memory of one float32 and one bf16 training step.

Speed: each configuration runs in a fresh process (JAX's simulated devices must be asked for before
it is imported; DDP spawns its own), training on batches of 16 x 64 random token ids (the speed
does not depend on the text), with a callback that prints a wall-clock stamp after every step
(under DDP it runs in rank 0's process). The first steps (JAX compiles, DDP and the thread pools
start) are left out; the step time is the median of the rest. Tokens per second count the targets
of the global batch (1,024 per step). Correctness is not measured here: shared_tests prove the
data-parallel and bf16 steps (test_data_parallel.py, test_mixed_precision.py).

Memory: a fresh process builds the model and Adam, runs two steps (JAX compiles, torch allocates
its gradients and moments), then measures one more: the increase of the resident set's high-water
mark over the resident set before it (bench.fresh_process's method: malloc gives big blocks back).

This machine has 2 cores: 2 replicas share them, so data parallel cannot be faster here; what it
shows is its overhead (all-reduce, the split). The report says so with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import numpy as np

from .fresh_process import MALLOC_ENV, _measure_one_call
from .report import write_latest

BACKENDS = ("numpy", "torch", "jax")
BATCH, SEQ_LEN = 16, 64
RESULTS = os.path.join(os.path.dirname(__file__), "results", "training")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batches(config, count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, config.tgt_vocab_size - 2, (count, BATCH, SEQ_LEN + 1))  # no EOT / PAD ids
    return [{"ids": r[:, :-1], "targets": r[:, 1:]} for r in rows]


def _stamp(step: int, loss: float) -> None:  # module level: DDP pickles it into rank 0's process
    print(f"STAMP {step} {time.time():.6f}", flush=True)


def child_speed(backend: str, precision: str, replicas: int, steps: int) -> None:
    if backend == "jax" and replicas > 1:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={replicas}"
    import importlib

    from transformer_run.schedules import constant_schedule
    from transformer_spec import init_params
    from transformer_text import corpus

    impl = importlib.import_module(f"{backend}_impl")
    config = corpus.config()
    model = impl.build_model(config, init_params(config, seed=0, dtype="float32"))
    compute = {"compute_dtype": "bfloat16"} if precision == "bfloat16" else {}
    if replicas == 1:
        impl.train(model, _batches(config), steps, constant_schedule(1e-4), callback=_stamp, **compute)
    else:
        impl.data_parallel_train(
            model, _batches(config), steps, constant_schedule(1e-4), callback=_stamp, data_parallel=replicas
        )
    print(json.dumps({"done": True}))


def child_memory(backend: str, precision: str) -> None:
    import importlib

    from transformer_run.schedules import constant_schedule
    from transformer_spec import init_params
    from transformer_text import corpus

    impl = importlib.import_module(f"{backend}_impl")
    config = corpus.config()
    model = impl.build_model(config, init_params(config, seed=0, dtype="float32"))
    optimizer = impl.Adam(model, constant_schedule(1e-4))
    batch = _batches(config)[0]
    compute = "bfloat16" if precision == "bfloat16" else None
    model.train()
    for _ in range(2):
        impl.train_step(model, optimizer, batch, 0.0, compute)
    print(json.dumps(_measure_one_call(lambda: impl.train_step(model, optimizer, batch, 0.0, compute))))


def _run(args: list[str], timeout: float = 900) -> tuple[list[float], dict[str, Any]]:
    env = os.environ | MALLOC_ENV
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.lm_training", "--child", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        return [], {"error": last[:300]}
    lines = done.stdout.strip().splitlines()
    stamps = [float(line.split()[2]) for line in lines if line.startswith("STAMP ")]
    return stamps, json.loads(lines[-1])


def gemm_rates(n: int = 1024) -> dict[str, float]:
    """GFLOP/s of one n x n x n matmul per framework and dtype, median of 5 after a warm-up."""
    import importlib.util

    rates = {}

    def rate(name, run):
        run()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        rates[name] = 2 * n**3 / float(np.median(times)) / 1e9

    a = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
    rate("numpy float32", lambda: a @ a)
    if importlib.util.find_spec("torch"):
        import torch

        t = torch.from_numpy(a)
        rate("torch float32", lambda: t @ t)
        b = t.bfloat16()
        rate("torch bfloat16", lambda: b @ b)
    if importlib.util.find_spec("jax"):
        import jax
        import jax.numpy as jnp

        x = jnp.asarray(a)
        mm = jax.jit(lambda x: jnp.matmul(x, x, precision=jax.lax.Precision.HIGHEST))
        rate("jax float32", lambda: mm(x).block_until_ready())
        y = x.astype(jnp.bfloat16)
        rate("jax bfloat16", lambda: mm(y).block_until_ready())
    return rates


def training_flops_per_token(config) -> float:
    """3 x the forward's matmul FLOPs per token (the backward costs about twice the forward)."""
    d, d_kv = config.d_model, config.num_kv_heads * (config.d_model // config.num_heads)
    per_layer = 2 * (d * d + 2 * d * d_kv + d * d + 3 * d * config.d_ff) + 4 * SEQ_LEN * d  # weights + attention
    return 3.0 * (config.num_decoder_layers * per_layer + 2 * d * config.tgt_vocab_size)


def bf16_errors() -> dict[str, Any]:
    """The error budgets' measured values: shared_tests/training/test_mixed_precision.py's cases (bench.bf16_cases)."""
    from transformer_run.mixed_precision import BUDGET, ROUNDING_MULTIPLE, gradients_error, relative_error

    from . import bf16_cases as cases

    rows = []
    for name in cases.CONFIGS:
        want_logits, _, want_grads = cases.float32_reference(name)
        runs = {}
        floor_logits, floor_grads = cases.rounding_floor(name)
        rows.append({"config": name, "what": "float64 on the weights rounded to bf16 (the rounding floor)",
                     "logits": floor_logits, "gradients": floor_grads})  # fmt: skip
        for backend, policy in cases.RUNS:
            logits, _, grads = runs[backend, policy] = cases.bf16_run(name, backend, policy)
            error_logits, error_grads = relative_error(logits, want_logits), gradients_error(grads, want_grads)
            rows.append({"config": name, "what": f"{backend} ({policy}) vs float32", "logits": error_logits,
                         "gradients": error_grads,
                         "of_floor": (error_logits / floor_logits, error_grads / floor_grads)})  # fmt: skip
        for first, second in cases.PAIRS:
            rows.append({"config": name, "what": f"{first[0]} ({first[1]}) vs {second[0]} ({second[1]})",
                         "logits": relative_error(runs[first][0], runs[second][0]),
                         "gradients": gradients_error(runs[first][2], runs[second][2])})  # fmt: skip
    curves = {backend: cases.curve_gap(backend) for backend in BACKENDS}
    return {"rows": rows, "curve_gap": curves, "budget": BUDGET, "curve_steps": cases.CURVE_STEPS,
            "rounding_multiple": ROUNDING_MULTIPLE}  # fmt: skip


def measure(quick: bool) -> dict[str, Any]:
    from transformer_text import corpus

    steps, warm = (8, 3) if quick else (30, 5)
    config = corpus.config()
    flops = training_flops_per_token(config)
    speed = []
    for backend in BACKENDS:
        for precision, replicas in (("float32", 1), ("bfloat16", 1), ("float32", 2)):
            started = time.perf_counter()
            stamps, result = _run(["speed", backend, precision, str(replicas), str(steps)])
            row = {"backend": backend, "precision": precision, "replicas": replicas}
            if "error" in result or len(stamps) < warm + 2:
                row["error"] = result.get("error", f"{len(stamps)} steps stamped")
            else:
                step_s = float(np.median(np.diff(stamps[warm - 1 :])))
                row |= {
                    "ms_per_step": 1e3 * step_s,
                    "tokens_per_s": BATCH * SEQ_LEN / step_s,
                    "gflops": BATCH * SEQ_LEN * flops / step_s / 1e9,
                    "steps_timed": len(stamps) - warm,
                }
            row["process_s"] = time.perf_counter() - started
            print(f"[bench] {row}", flush=True)
            speed.append(row)
    memory = []
    for backend in BACKENDS:
        for precision in ("float32", "bfloat16"):
            _, result = _run(["memory", backend, precision])
            memory.append({"backend": backend, "precision": precision} | result)
            print(f"[bench] {memory[-1]}", flush=True)
    return {
        "model": f"transformer_text.corpus.config(): {config.num_decoder_layers} layers, d_model {config.d_model}, "
        f"{config.num_heads} heads ({config.num_kv_heads} kv), d_ff {config.d_ff}, vocabulary {config.tgt_vocab_size}",
        "batch": f"{BATCH} x {SEQ_LEN} tokens",
        "flops_per_token": flops,
        "gemm_gflops": gemm_rates(),
        "speed": speed,
        "memory": memory,
        "bf16": bf16_errors(),
        "cpus": os.cpu_count(),
    }


def _percent(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.0f}%"


def markdown(results: dict[str, Any]) -> str:
    out = [
        "# Training the Shakespeare language model: speed and memory",
        "",
        f"{results['date']}, {results['cpu']} ({results['cpus']} CPUs), {results['versions']}; other processes "
        f"used {_percent(results.get('others_cpu_share'))} of the CPUs meanwhile, the hypervisor stole "
        f"{_percent(results.get('stolen_cpu_share'))}. Each configuration runs in its own "
        "process, one after another (not interleaved): on this machine the ratios move by up to 0.2 from run to run.",
        f"Model: {results['model']}; batch {results['batch']}; {results['flops_per_token'] / 1e6:.2f} MFLOP of "
        "matmuls per trained token (3 x forward).",
        "",
        "GEMM rate (1024 x 1024 x 1024, GFLOP/s): "
        + ", ".join(f"{name} {rate:.0f}" for name, rate in results["gemm_gflops"].items()),
        "",
        "| backend | precision | replicas | ms / step | tokens / s | GFLOP/s | vs its float32 single |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    single = {r["backend"]: r for r in results["speed"] if r["precision"] == "float32" and r["replicas"] == 1}
    for r in results["speed"]:
        if "error" in r:
            out.append(f"| {r['backend']} | {r['precision']} | {r['replicas']} | failed: {r['error']} | | | |")
            continue
        base = single.get(r["backend"], {}).get("tokens_per_s")
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        out.append(
            f"| {r['backend']} | {r['precision']} | {r['replicas']} | {r['ms_per_step']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['gflops']:.1f} | {ratio} |"
        )
    out += ["", "Peak memory of one training step (increase over the resident set before it):", ""]
    out += ["| backend | float32 MiB | bf16 MiB | bf16 / float32 |", "| --- | --- | --- | --- |"]
    for backend in BACKENDS:
        rows = {r["precision"]: r for r in results["memory"] if r["backend"] == backend}
        f32, bf16 = (rows.get(p, {}).get("peak_increase_mib") for p in ("float32", "bfloat16"))
        if f32 is None or bf16 is None:
            out.append(f"| {backend} | {f32} | {bf16} | - |")
        else:
            out.append(f"| {backend} | {f32:.1f} | {bf16:.1f} | {bf16 / f32:.2f}x |")
    out += [
        "",
        f"With {results['cpus']} CPUs, 2 replicas share the cores one process (or one device) had: data parallel "
        "shows its overhead here, not a speed-up. NumPy's bf16 is an emulation (every op in float32, rounded "
        "after), so it is slower than its float32 by construction; torch's CPU bf16 GEMM runs at the rate above.",
        "",
    ]
    return "\n".join(out)


def bf16_markdown(results: dict[str, Any]) -> str:
    bf16 = results["bf16"]
    out = ["| model | bf16 run | logits | gradients | ÷ rounding floor (logits, gradients) |",
           "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in bf16["rows"]:
        multiple = ", ".join(f"{x:.1f}x" for x in r["of_floor"]) if "of_floor" in r else ""
        out.append(f"| {r['config']} | {r['what']} | {r['logits']:.1e} | {r['gradients']:.1e} | {multiple} |")
    budget = bf16["budget"]
    curves = ", ".join(f"{name} {gap:.1e}" for name, gap in bf16["curve_gap"].items())
    out += [
        "",
        f"Budgets: logits {budget['logits']:.0e}, gradients {budget['gradients']:.0e} (norm-wise, relative), "
        f"and {bf16.get('rounding_multiple', '?')}x the model's rounding floor. "
        f"bf16 training (tiny-llama, copy task, {bf16['curve_steps']} Adam steps) against the float32 curve, "
        f"max relative gap per step: {curves} (budget {budget['loss_curve']:.0e}).",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lm_training", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 steps per configuration instead of 30")
    parser.add_argument("--out", default=RESULTS, help=f"folder for latest.json and latest.md (default: {RESULTS})")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "speed":
            child_speed(rest[0], rest[1], int(rest[2]), int(rest[3]))
        else:
            child_memory(rest[0], rest[1])
        return 0
    from .run import _cpu, _cpu_snapshot, _others_share, _versions

    before = _cpu_snapshot()
    results = measure(args.quick)
    share = _others_share(before, _cpu_snapshot())
    results |= {
        "others_cpu_share": share["others"] if share else None,
        "stolen_cpu_share": share["stolen"] if share else None,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": _cpu() or platform.machine(),
        "versions": _versions(),
        "quick": args.quick,
    }
    text = markdown(results) + "\n## bf16 against float32, and across frameworks\n\n" + bf16_markdown(results)
    write_latest(args.out, results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
