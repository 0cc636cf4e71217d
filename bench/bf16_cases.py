"""The bf16 cases, written once: shared_tests/training/test_mixed_precision.py holds them to the error budgets,
``python -m bench.lm_training`` reads their values out for docs/gradients-and-training.md.

Each backend runs in bf16 under its policy (NumPy both) on three 2-layer models at their seeded
init: tiny-lm (LayerNorm, GELU, learned positions), tiny-llama (RMSNorm, SwiGLU, rotary, grouped
kv heads) and tiny (the encoder-decoder), on a batch with right padding. A backend that is not
installed raises ImportError (the tests skip it).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from transformer_spec import Config, init_params

CONFIGS = {name: Config.preset(name) for name in ("tiny-lm", "tiny-llama", "tiny")}
# (backend, policy): NumPy runs both policies; torch autocast, JAX the compute dtype
RUNS = [("numpy", "autocast"), ("numpy", "compute_dtype"), ("torch", "autocast"), ("jax", "compute_dtype")]
PAIRS = [(("numpy", "autocast"), ("torch", "autocast")), (("numpy", "compute_dtype"), ("jax", "compute_dtype")),
         (("torch", "autocast"), ("jax", "compute_dtype"))]  # fmt: skip
CURVE_STEPS = 40
_MEASURED: dict = {}  # computed once per process


def batch_and_inputs(config: Config) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
    """8 rows of 8 targets (the last 0, 1, 3 or 5 of a row padded) and the model's inputs for them."""
    rng = np.random.default_rng(0)
    if config.kind == "encoder_decoder":
        src, tgt = rng.integers(4, config.src_vocab_size, (8, 7)), rng.integers(4, config.tgt_vocab_size, (8, 9))
        tgt[np.arange(8) % 4 == 3, -3:] = config.pad_id
        return {"src_ids": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}, (src, tgt[:, :-1])
    ids = rng.integers(4, config.tgt_vocab_size, (8, 9))
    for row, padded in enumerate([0, 1, 3, 5] * 2):
        ids[row, ids.shape[1] - padded :] = config.pad_id
    return {"ids": ids[:, :-1], "targets": ids[:, 1:]}, (ids[:, :-1],)


def copy_batches(config: Config) -> list[dict[str, np.ndarray]]:
    """A task a 2-layer model learns in 40 steps: each row is 5 tokens, then the same 5 again."""
    batches = []
    for seed in range(4):
        x = np.random.default_rng(seed).integers(4, config.tgt_vocab_size, (16, 5))
        ids = np.concatenate([x, x], axis=1)
        batches.append({"ids": ids[:, :-1], "targets": ids[:, 1:]})
    return batches


def float32_reference(name: str) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """NumPy float32's (logits, loss, gradients) on ``name``'s batch."""
    if (name, "float32") not in _MEASURED:
        import numpy_impl

        config = CONFIGS[name]
        model = numpy_impl.build_model(config, init_params(config, seed=0), "float32")
        batch, inputs = batch_and_inputs(config)
        loss, grads = numpy_impl.loss_and_grads(model, batch)
        _MEASURED[name, "float32"] = (model(*inputs).logits, loss, grads)
    return _MEASURED[name, "float32"]


def rounding_floor(name: str) -> tuple[float, float]:
    """What rounding the weights to bf16 alone costs ``name``: (logits, gradients) relative errors of
    NumPy float64 on the bf16-rounded weights against float64 on the weights themselves. Every bf16
    policy multiplies by bf16 weights, so no bf16 pass can be expected to do better than this."""
    if (name, "floor") not in _MEASURED:
        import ml_dtypes

        import numpy_impl
        from transformer_run.mixed_precision import gradients_error, relative_error

        config = CONFIGS[name]
        batch, inputs = batch_and_inputs(config)
        params = init_params(config, seed=0)
        bf16 = ml_dtypes.bfloat16
        rounded = {k: np.asarray(v, np.float32).astype(bf16).astype(np.float64) for k, v in params.items()}
        runs = []
        for weights in (params, rounded):
            model = numpy_impl.build_model(config, weights, "float64")
            runs.append((model(*inputs).logits, numpy_impl.loss_and_grads(model, batch)[1]))
        (want_logits, want_grads), (logits, grads) = runs
        _MEASURED[name, "floor"] = (relative_error(logits, want_logits), gradients_error(grads, want_grads))
    return _MEASURED[name, "floor"]


def bf16_run(name: str, backend: str, policy: str) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """``backend``'s bf16 (logits, loss, gradients) under ``policy``, all float32."""
    if (name, backend, policy) not in _MEASURED:
        mixed = importlib.import_module(f"{backend}_impl.mixed_precision")
        params = importlib.import_module(f"{backend}_impl.params")
        config = CONFIGS[name]
        model = params.build_model(config, init_params(config, seed=0), "float32")
        batch, inputs = batch_and_inputs(config)
        logits = mixed.mixed_precision_logits(model, *inputs, policy=policy)
        loss, grads = mixed.mixed_precision_loss_and_grads(model, batch, policy=policy)
        _MEASURED[name, backend, policy] = (logits, loss, grads)
    return _MEASURED[name, backend, policy]


def curve_gap(backend: str) -> float:
    """max over the steps of |bf16 loss - float32 loss| / float32 loss: tiny-llama, the copy task,
    CURVE_STEPS Adam steps from the same init, against NumPy float32's curve."""
    from transformer_run.schedules import warmup_schedule

    if ("curve", backend) not in _MEASURED:
        import numpy_impl

        config = CONFIGS["tiny-llama"]
        params, batches = init_params(config, seed=0), copy_batches(config)
        schedule = warmup_schedule(config.d_model, 100, 1.0)
        if "curve" not in _MEASURED:
            model = numpy_impl.build_model(config, params, "float32")
            _MEASURED["curve"] = np.array(numpy_impl.train(model, batches, CURVE_STEPS, schedule))
        want = _MEASURED["curve"]
        impl: Any = importlib.import_module(f"{backend}_impl")
        model = impl.build_model(config, params, "float32")
        losses = np.array(impl.train(model, batches, CURVE_STEPS, schedule, compute_dtype="bfloat16"))
        assert losses[-1] < 0.8 * losses[0], f"{backend}: bf16 training did not learn: {losses[0]} -> {losses[-1]}"
        _MEASURED["curve", backend] = float(np.max(np.abs(losses - want) / want))
    return _MEASURED["curve", backend]
