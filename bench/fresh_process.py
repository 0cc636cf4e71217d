"""Measurements that need a fresh Python process: peak memory of one forward, JAX's first-call compile
(and, for ``bench/smollm2.py``, the memory of loading SmolLM2 into every backend and its decoding compiles).

The parent (``memory_section``, ``compile_section``) starts ``python -m bench.fresh_process
...`` once per measurement and reads the one JSON line it prints.

Peak memory, method: in the child, build the model and its inputs, collect garbage,
read the resident set size (``VmRSS`` in /proc/self/status), reset the kernel's
high-water mark (write "5" to /proc/self/clear_refs), run ONE forward pass, read the
high-water mark (``VmHWM``). The increase is the forward's peak: activations,
temporaries, the output and any workspace, not the weights. For JAX the program is
compiled ahead of time (``jit(...).lower(...).compile()``) before the reset, so the
compiler's memory is not counted, and XLA's own plan for the temporaries
(``memory_analysis().temp_size_in_bytes``) is reported next to it.

glibc's malloc would otherwise keep freed blocks and grow its mmap threshold, so RSS
would not fall when the frameworks free memory: the children run with
``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, which makes every large block its own
mapping, given back to the kernel when freed. The peak is then what was live at once.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 20)}

MEMORY_IMPLEMENTATIONS = {
    "numpy: ours": "our NumPy encoder stack",
    "numpy: ours, layer by layer": "our NumPy EncoderLayer s called one after the other (what the stack could use)",
    "torch: ours": "our torch encoder stack",
    "torch: nn.TransformerEncoder": "nn.TransformerEncoder, torch's default (fast path, nested tensors)",
    "torch: nn.TransformerEncoder (fast path off)": "nn.TransformerEncoder, op by op",
    "jax: ours": "our jitted JAX encoder stack",
    "jax: Flax NNX layers": "the encoder built from Flax NNX layers, jitted the same way",
    "bert: ours (torch)": "our whole BERT model (torch)",
    "bert: HF BertModel (sdpa)": "transformers.BertModel, attn_implementation='sdpa'",
}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _measure_one_call(run) -> dict[str, Any]:
    gc.collect()
    before = _status_kib("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    output = run()
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    del output
    return {
        "rss_before_mib": before / 1024,
        "peak_increase_mib": (peak - before) / 1024,
        "peak_reset": reset,  # False: the peak includes building the model
        "seconds": seconds,
    }


def _candidate(name: str, preset: str, batch: int, seq_len: int):
    """-> (run, extra info) for one entry of MEMORY_IMPLEMENTATIONS."""
    from transformer_spec import Config

    from . import implementations as impl

    config = Config.preset(preset)
    work = impl.make_workload(config, batch, seq_len)
    if name.startswith("bert:"):
        params, state_dict = impl.hf_bert_weights(config)
        if "HF" in name:
            return impl.hf_bert(work, state_dict, "sdpa").run, {}
        return impl.torch_ours_bert(work, params).run, {}
    params = impl.encoder_params(config)
    if name == "numpy: ours":
        return impl.numpy_ours_encoder(work, params).run, {}
    if name == "numpy: ours, layer by layer":
        import numpy_impl

        encoder = numpy_impl.from_params(numpy_impl.Encoder, config, params)

        def layer_by_layer():
            x = work.x
            for layer in encoder.layers:
                x = layer(x, work.src_mask)[0]  # each layer's saved arrays are dropped as it returns
            return x

        return layer_by_layer, {}
    if name == "torch: ours":
        return impl.torch_ours_encoder(work, params).run, {}
    if name.startswith("torch: nn.TransformerEncoder"):
        return impl.torch_nn_encoder(work, params, fast_path="fast path off" not in name).run, {}
    if name.startswith("jax:"):
        return _jax_compiled(name, work, params)
    raise ValueError(f"unknown implementation {name!r}")


def _jax_compiled(name: str, work, params):
    """The same jitted forward the timed rows use, compiled ahead of time."""
    import jax.numpy as jnp

    import jax_impl

    from .flax_encoder import flax_encoder_from_params
    from .implementations import jax_encoder_forward

    if name == "jax: ours":
        module = jax_impl.from_params(jax_impl.Encoder, work.config, params)
    else:
        module = flax_encoder_from_params(work.config, params)
    x, mask = jnp.asarray(work.x), jnp.asarray(work.src_mask)
    compiled = (
        jax_encoder_forward().lower(module, x, mask).compile()
    )  # ahead of time: compiling is not the forward's memory
    analysis = compiled.memory_analysis()
    extra = {"xla_temp_mib": analysis.temp_size_in_bytes / 2**20} if analysis is not None else {}
    return (lambda: compiled(module, x, mask).block_until_ready()), extra


def child_memory(name: str, preset: str, batch: int, seq_len: int) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore")
    run, extra = _candidate(name, preset, batch, seq_len)  # torch candidates run under inference_mode
    return _measure_one_call(run) | extra


def child_compile(preset: str, batch: int, seq_len: int) -> dict[str, Any]:
    """First and later calls of our jitted JAX model, with JAX's own trace/lower/compile timings."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_impl
    from transformer_spec import Config, init_params

    from .compare import JaxCompileClock

    models = []
    for layers in (None, 1):  # the preset's depth first (in a fresh process), then 1 layer for scale
        config = Config.preset(preset)
        if layers is not None:
            config = config.replace(num_encoder_layers=layers)
        model = jax_impl.build_model(config, init_params(config, seed=0, dtype="float32"))
        ids = jnp.asarray(np.random.default_rng(0).integers(1, config.src_vocab_size, (batch, seq_len)), jnp.int32)
        calls = []
        for _ in range(3):
            before = JaxCompileClock.snapshot()
            start = time.perf_counter()
            jax.block_until_ready(model(ids).last_hidden_state)
            seconds = time.perf_counter() - start
            events = {name: t - before[name] for name, t in JaxCompileClock.snapshot().items()}
            calls.append({"seconds": seconds, "compile_s": sum(events.values()), "events": events})
        models.append(
            {
                "layers": config.num_encoder_layers,
                "first_call_s": calls[0]["seconds"],
                "compile_s": calls[0]["compile_s"],  # trace + lower to MLIR + XLA compile
                "events": calls[0]["events"],
                "later_call_s": float(np.median([c["seconds"] for c in calls[1:]])),
                "recompiled_later": any(c["compile_s"] > 0 for c in calls[1:]),
            }
        )
    return {"models": models}


def _run_child(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    env = os.environ | (env or {})
    done = subprocess.run(
        [sys.executable, "-m", "bench.fresh_process", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        return {"error": last[:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_section(preset: str, batch: int, seq_len: int, names: list[str]) -> dict[str, Any]:
    rows = {}
    for name in names:
        rows[name] = _run_child(["memory", name, preset, str(batch), str(seq_len)], MALLOC_ENV)
        rows[name]["what"] = MEMORY_IMPLEMENTATIONS[name]
    return {"preset": preset, "shape": f"{batch}x{seq_len}", "rows": rows}


def compile_section(preset: str, batch: int, seq_len: int) -> dict[str, Any]:
    return {"preset": preset, "shape": f"{batch}x{seq_len}"} | _run_child(["compile", preset, str(batch), str(seq_len)])


def main(argv: list[str]) -> None:
    if argv[0] == "memory":
        name, preset, batch, seq_len = argv[1], argv[2], int(argv[3]), int(argv[4])
        print(json.dumps(child_memory(name, preset, batch, seq_len)))
    elif argv[0] == "compile":
        print(json.dumps(child_compile(argv[1], int(argv[2]), int(argv[3]))))
    elif argv[0] == "smollm2":
        from .smollm2 import child_smollm2

        print(json.dumps(child_smollm2([int(b) for b in argv[1].split(",")])))
    else:
        raise SystemExit(f"unknown measurement {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
