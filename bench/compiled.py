"""``python -m bench.compiled``: torch.compile beside jax.jit, on the same weights, eager beside compiled.

Three workloads, each in torch eager and compiled (``torch_impl.compiled``, ``compiled_step``,
``compiled.compile_layers``), JAX eager (``jax.disable_jit``: op by op) and jit-compiled (how JAX
runs), and NumPy (no compiler) as the eager reference:

* forward: BERT-base (12 layers, d_model 768) on 8 x 128 ids, float32 (``--quick``: tiny-bert);
* training step: the tiny encoder-decoder, 8 x 16 tokens, one Adam step (forward, loss, backward);
* cached decoding: the tiny LM, greedy, batch 1, an 8-token prompt and 32 new tokens.

For each: the steady time (median of rounds interleaved across the five, after the first call),
the compile time (first call minus steady call), the compilations over a run whose lengths
change (forward: lengths 16, 24, 32, 40, 48 on the tiny model; torch counts Dynamo's compiled
graphs, JAX the jitted function's cache entries), the peak memory of one steady call (the
resident set's increase, sampled every millisecond), and the difference to NumPy float64
(max |diff| / max |reference|; for decoding, whether the tokens are the same).

Writes bench/results/compiled/latest.json and latest.md; ``python -m tools.readme_numbers`` puts
its table into docs/performance.md and its line into the README.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .report import write_latest

RESULTS = os.path.join(os.path.dirname(__file__), "results", "compiled")
LENGTHS = (16, 24, 32, 40, 48)
IMPLEMENTATIONS = ("numpy", "torch eager", "torch compiled", "jax eager", "jax jit")


# ------------------------------------------------------------------------- memory
class PeakMemory:
    """The resident set's peak increase during the block: freed memory handed back to the system
    first (``malloc_trim``, else pages freed by an earlier call would be reused unseen), then the
    kernel's high-water mark reset (``clear_refs``) and read after (``VmHWM``). Linux only."""

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        self.start = self._status("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak = self._status("VmHWM") - self.start


# ------------------------------------------------------------------------- counting compilations
def torch_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _sync(result: Any) -> Any:
    import jax

    return jax.block_until_ready(result)


# ------------------------------------------------------------------------- the workloads
def forward_runs(preset: str, batch: int, seq_len: int) -> tuple[dict[str, Callable[[], Any]], Any, Callable]:
    """name -> a call of the float32 forward pass; the NumPy float64 output; the field reader."""
    import jax
    import torch

    import jax_impl
    import numpy_impl
    import torch_impl
    from transformer_spec import Config, init_params

    config = Config.preset(preset)
    params = init_params(config, seed=0, dtype="float64")
    rng = np.random.default_rng(0)
    ids = rng.integers(1, config.src_vocab_size, size=(batch, seq_len))
    p32 = {k: v.astype("float32") for k, v in params.items()}
    reference = numpy_impl.build_model(config, params)(ids).last_hidden_state
    np_model = numpy_impl.build_model(config, p32)
    t_model = torch_impl.build_model(config, p32)
    t_compiled = torch_impl.compiled(t_model)
    j_model = jax_impl.build_model(config, p32)
    j_jit = jax_impl.compiled(j_model)
    t_ids, j_ids = torch.from_numpy(ids), jax.numpy.asarray(ids)

    def torch_run(fn):
        def run():
            with torch.no_grad():
                return fn(t_ids).last_hidden_state.numpy()

        return run

    def jax_eager():
        with jax.disable_jit():
            return np.asarray(_sync(j_model(j_ids).last_hidden_state))

    runs = {
        "numpy": lambda: np_model(ids).last_hidden_state,
        "torch eager": torch_run(t_model),
        "torch compiled": torch_run(t_compiled),
        "jax eager": jax_eager,
        "jax jit": lambda: np.asarray(_sync(j_jit(j_ids).last_hidden_state)),
    }
    return runs, reference, lambda out: out


def training_runs() -> tuple[dict[str, Callable[[], Any]], Any, Callable]:
    """name -> one Adam step of the tiny encoder-decoder in float32, returning its loss."""
    import jax

    import jax_impl
    import numpy_impl
    import torch_impl
    from transformer_run.data import copy_task
    from transformer_spec import Config, init_params

    config = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=32)
    params = init_params(config, seed=0, dtype="float64")
    batch = copy_task(8, 15, 12, seed=0)  # 8 sequences, 16 target tokens each
    p32 = {k: v.astype("float32") for k, v in params.items()}

    def stepper(impl, weights, step):
        model = impl.build_model(config, weights)
        optimizer = impl.Adam(model, lambda t: 1e-4)
        return lambda: step(model, optimizer, batch)

    ref_model = numpy_impl.build_model(config, params)
    reference = numpy_impl.train_step(ref_model, numpy_impl.Adam(ref_model, lambda t: 1e-4), batch)
    jax_eager_step = stepper(jax_impl, p32, jax_impl.train_step)

    def jax_eager():
        with jax.disable_jit():
            return jax_eager_step()

    from torch_impl.compiled import compiled_train_step

    runs = {
        "numpy": stepper(numpy_impl, p32, numpy_impl.train_step),
        "torch eager": stepper(torch_impl, p32, torch_impl.train_step),
        "torch compiled": stepper(torch_impl, p32, compiled_train_step),
        "jax eager": jax_eager,
        "jax jit": stepper(jax_impl, p32, jax_impl.train_step),
    }
    return runs, np.array(reference), lambda out: np.array(out)


def decoding_runs() -> tuple[dict[str, Callable[[], Any]], Any, Callable]:
    """name -> greedy cached decoding of the tiny LM in float32: 8-token prompt, 32 new tokens."""
    import jax

    import jax_impl
    import numpy_impl
    import torch_impl
    from torch_impl.compiled import compile_layers
    from transformer_spec import Config, init_params

    config = Config.preset("tiny-lm", max_len=64)
    params = init_params(config, seed=0, dtype="float64")
    prompt = np.random.default_rng(0).integers(3, config.tgt_vocab_size, size=(1, 8))
    p32 = {k: v.astype("float32") for k, v in params.items()}
    eos = None  # no end token: every run makes all 32 tokens

    def greedy(impl, model):
        return lambda: impl.greedy(model, prompt, 1, eos, 32)

    reference = greedy(numpy_impl, numpy_impl.build_model(config, params))()
    j_model = jax_impl.build_model(config, p32)

    def jax_eager():
        with jax.disable_jit():
            return jax_impl.greedy(j_model, prompt, 1, eos, 32)

    runs = {
        "numpy": greedy(numpy_impl, numpy_impl.build_model(config, p32)),
        "torch eager": greedy(torch_impl, torch_impl.build_model(config, p32)),
        "torch compiled": greedy(torch_impl, compile_layers(torch_impl.build_model(config, p32))),
        "jax eager": jax_eager,
        "jax jit": greedy(jax_impl, jax_impl.build_model(config, p32)),
    }
    return runs, reference, lambda out: out


def lengths_run() -> dict[str, int]:
    """Compilations over forward calls at lengths 16, 24, 32, 40, 48 (tiny-bert, batch 2)."""
    import jax
    import torch

    import jax_impl
    import torch_impl
    from jax_impl.compiled import _plain_jit_run
    from transformer_spec import Config, init_params

    torch._dynamo.reset()  # forget what the workloads taught it (which dimensions change)
    config = Config.preset("tiny-bert", max_len=64)
    params = init_params(config, seed=1, dtype="float32")
    t_run = torch_impl.compiled(torch_impl.build_model(config, params))
    j_run = jax_impl.compiled(jax_impl.build_model(config, params))
    torch_before, jax_before = torch_graphs(), _plain_jit_run._cache_size()
    rng = np.random.default_rng(1)
    for length in LENGTHS:
        ids = rng.integers(1, config.src_vocab_size, size=(2, length))
        with torch.no_grad():
            t_run(torch.from_numpy(ids))
        _sync(j_run(jax.numpy.asarray(ids)).last_hidden_state)
    return {"torch compiled": torch_graphs() - torch_before, "jax jit": _plain_jit_run._cache_size() - jax_before}


def measure_workload(name: str, runs: dict[str, Callable[[], Any]], reference: Any, read: Callable,
                     rounds: int) -> dict[str, Any]:  # fmt: skip
    rows = {}
    for impl, run in runs.items():  # the first call: compiling included where there is any
        graphs = torch_graphs()
        start = time.perf_counter()
        out = run()
        rows[impl] = {"first_s": time.perf_counter() - start, "graphs": torch_graphs() - graphs}
        got = read(out)
        if name == "cached decoding":
            rows[impl]["same_tokens"] = bool(np.array_equal(got, reference))
        else:
            scale = float(np.abs(reference).max())
            rows[impl]["diff"] = float(np.abs(np.asarray(got, np.float64) - reference).max()) / scale
    times = {impl: [] for impl in runs}
    for _ in range(rounds):  # interleaved: a slow minute hits every implementation alike
        for impl, run in runs.items():
            start = time.perf_counter()
            run()
            times[impl].append(time.perf_counter() - start)
    for impl, run in runs.items():
        with PeakMemory() as memory:
            run()
        steady = statistics.median(times[impl])
        rows[impl] |= {"steady_s": steady, "compile_s": max(0.0, rows[impl]["first_s"] - steady),
                       "peak_mib": memory.peak / 2**20}  # fmt: skip
    return {"workload": name, "rows": rows}


def measure(quick: bool, threads: int) -> dict[str, Any]:
    """Every framework on ``threads`` threads (set before JAX starts: XLA reads its flags once)."""
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + ("" if threads > 1 else " --xla_cpu_multi_thread_eigen=false")
    ).strip()
    import jax
    import torch
    from threadpoolctl import threadpool_limits

    jax.config.update("jax_enable_x64", True)  # the float64 NumPy references are built alongside
    torch.set_num_threads(threads)  # also the threads of Inductor's generated OpenMP loops
    threadpool_limits(threads)  # NumPy's BLAS
    preset, batch, seq_len = ("tiny-bert", 8, 64) if quick else ("bert-base", 8, 128)
    rounds = 3 if quick else 5
    started = time.perf_counter()
    workloads = [
        measure_workload(f"forward, {preset} {batch} x {seq_len}", *forward_runs(preset, batch, seq_len), rounds),
        measure_workload("training step, tiny 8 x 16", *training_runs(), rounds),
        measure_workload("cached decoding", *decoding_runs(), rounds),
    ]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)",
        "versions": f"torch {torch.__version__}, jax {jax.__version__}, numpy {np.__version__}",
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "threads": threads,
        "workloads": workloads,
        "lengths": lengths_run(),
        "total_s": time.perf_counter() - started,
    }


# ------------------------------------------------------------------------- the report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds < 10 else f"{seconds * 1e3:.0f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{results['date']}, {results['machine']}, {results['versions']}; {results['threads']} thread(s) per "
        f"framework; load average {results['load']} at the end (a shared machine: the ratios within one run are "
        "what to read).",
        "",
        "| workload | implementation | steady ms | vs eager | compile s | graphs compiled | peak MiB "
        "| vs NumPy float64 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload in results["workloads"]:
        rows = workload["rows"]
        for impl in IMPLEMENTATIONS:
            row = rows[impl]
            eager = rows.get(impl.replace("compiled", "eager").replace("jit", "eager"), row)
            ratio = f"{eager['steady_s'] / row['steady_s']:.2f}x" if impl in ("torch compiled", "jax jit") else "-"
            compiled = impl in ("torch compiled", "jax jit")
            if "same_tokens" in row:
                versus = "same tokens" if row["same_tokens"] else "**other tokens**"
            else:
                versus = f"{row['diff']:.1e}"
            graphs = str(row["graphs"]) if impl.startswith("torch") else "-"
            lines.append(
                f"| {workload['workload']} | {impl} | {_ms(row['steady_s'])} | {ratio} | "
                f"{row['compile_s']:.1f} | {graphs if compiled or impl == 'torch eager' else '-'} | "
                f"{row['peak_mib']:.1f} | {versus} |"
            )
    lengths = results["lengths"]
    forward = results["workloads"][0]
    verdicts = []
    for framework, eager, compiled in (("torch", "torch eager", "torch compiled"), ("JAX", "jax eager", "jax jit")):
        ratio = forward["rows"][eager]["steady_s"] / forward["rows"][compiled]["steady_s"]
        verdicts.append(f"{framework} {ratio:.2f}x ({'met' if ratio >= 1 else f'**not met**: {1 - ratio:.0%} slower'})")
    lines += [
        "",
        f"Target, {forward['workload']}: compiled never slower than eager in the same run (eager's time over the "
        f"compiled one's >= 1): {'; '.join(verdicts)}.",
        "",
        f"Compilations over forward calls at lengths {', '.join(map(str, LENGTHS))} (tiny-bert, batch 2): "
        f"torch.compile compiled {lengths['torch compiled']} graphs (torch's default: the first call specialises "
        "on its shapes, a call with another length compiles again with the length symbolic, and that graph serves "
        f"every later length), jax.jit {lengths['jax jit']} programs (one per shape). "
        "\"vs eager\": eager's steady time over the compiled one's (above 1: compiled is faster). "
        "\"compile s\": the first call's time less a steady call's. \"graphs compiled\": Dynamo's graphs in the "
        "first call (JAX: -). \"peak MiB\": the resident set's largest increase during one steady call (what a "
        "framework keeps between calls, such as the buffers jit-compiled XLA reuses, is not in it).",
        "",
        "Generated from `bench/results/compiled/latest.json` (`python -m bench.compiled`).",
    ]
    return "\n".join(lines)


def line(results: dict[str, Any]) -> str:
    """One sentence for the README: the BERT-base forward, compiled vs eager in each framework."""
    rows = results["workloads"][0]["rows"]
    torch_ratio = rows["torch eager"]["steady_s"] / rows["torch compiled"]["steady_s"]
    jax_ratio = rows["jax eager"]["steady_s"] / rows["jax jit"]["steady_s"]
    return (
        f"Compiled vs eager, {results['workloads'][0]['workload']}: torch.compile {torch_ratio:.2f}x eager's speed "
        f"after {rows['torch compiled']['compile_s']:.0f} s of compiling, jax.jit {jax_ratio:.2f}x after "
        f"{rows['jax jit']['compile_s']:.0f} s ({results['date']}; "
        "[the table](docs/performance.md))."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compiled", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-bert for the forward pass (minutes, not ten)")
    parser.add_argument("--out", default=RESULTS, help="directory for latest.json and latest.md")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="threads of every framework (default 1: on a shared machine a pool of threads waits for busy cores)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    results = measure(args.quick, args.threads)
    write_latest(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
