"""The models, batches, plans and measures every backend's sharding tests share: each backend's
sharded step is held to the same single-device numbers on the same inputs."""

from __future__ import annotations

import functools

import numpy as np

from transformer_run.batches import encoder_decoder_batch
from transformer_run.schedules import warmup_schedule
from transformer_run.sharding import Plan
from transformer_spec import Config, init_params

from ..helpers import padded_batch

# Sizes every tested degree divides, still unequal to each other (a transposed split cannot hide).
LLAMA = Config.preset("tiny-llama").replace(d_model=72, num_heads=6, num_kv_heads=2, d_ff=36, tgt_vocab_size=64)
# The encoder-decoder with one layer a side: its sharded programs are the slowest to compile and to
# run, and each kind of layer (self-attention; self- and cross-attention) once is what it adds to
# the decoder's two layers (and MEMORY_CASE's twelve).
PAPER = Config.preset("tiny").replace(
    num_heads=4, d_ff=44, src_vocab_size=48, tgt_vocab_size=40, num_encoder_layers=1, num_decoder_layers=1
)
CONFIGS = {"llama": LLAMA, "paper": PAPER}
# The model FSDP's memory is measured on in torch and JAX: 12 layers, 66 MB of float32 weights.
MEMORY_CASE = LLAMA.replace(num_decoder_layers=12, d_model=576, d_ff=288)
PLANS = {
    "fsdp": Plan(fsdp=2),
    "tp": Plan(tensor_parallel=2),
    "fsdp-x-tp": Plan(fsdp=2, tensor_parallel=2),
    "dp-x-tp": Plan(data_parallel=2, tensor_parallel=2),
}
STEPS = 20
# The (model, plan) pairs torch's and JAX's sharded steps also run in float32 (each is a program of
# its own to trace and compile): one of each model, one tensor parallel alone and one on the 2-D
# mesh, so that each kind of collective runs in float32 once. NumPy's runs every plan in both.
FLOAT32 = {("llama", "tp"), ("paper", "fsdp-x-tp")}
# A gradient that is zero in exact arithmetic (the key-projection bias) is measured against this share
# of the model's largest gradient rather than its own rounding noise (as in test_data_parallel.py).
FLOOR = {"float64": 1e-3, "float32": 1e-2}


def batch_of(config: Config) -> dict[str, np.ndarray]:
    if config.kind == "decoder_only":
        return padded_batch(config)
    rng = np.random.default_rng(1)
    src = rng.integers(4, config.src_vocab_size, (8, 6))
    tgt = np.zeros((8, 8), np.int64)
    for row, length in enumerate([8, 7, 7, 5, 3, 2, 2, 1]):  # unevenly padded targets
        tgt[row, :length] = rng.integers(4, config.tgt_vocab_size, length)
    return encoder_decoder_batch(src, tgt)


def with_biases(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights with every bias drawn at random: a bias added on the wrong rank, or twice, shows."""
    rng = np.random.default_rng(2)
    return {n: p + 0.1 * rng.standard_normal(p.shape).astype(p.dtype) if n.endswith("bias") else p
            for n, p in params.items()}  # fmt: skip


def params_of(config: Config, dtype: str) -> dict[str, np.ndarray]:
    """The seeded weights with random biases (the loss and gradients are checked on these)."""
    return with_biases(init_params(config, seed=0, dtype=dtype))


def adam_config(name: str) -> Config:
    """The model the Adam runs train: without attention biases. The key projection's bias has a
    gradient that is zero in exact arithmetic, and Adam turns its rounding noise into updates of
    about the learning rate, different on each summation order. Seeded weights (no random biases)."""
    return CONFIGS[name].replace(attention_bias=False)


def schedule(config: Config):
    return warmup_schedule(config.d_model, warmup_steps=400, factor=0.5)


# Dropout's runs: a few Adam steps from a seed other than the default, each backend's sharded run
# against its own single device (each framework draws its masks from its own generator).
DROPOUT, DROPOUT_STEPS, DROPOUT_SEED = 0.1, 3, 5


def dropout_config(name: str) -> Config:
    """adam_config(name) with dropout DROPOUT at its four places (docs/gradients-and-training.md)."""
    return adam_config(name).replace(dropout=DROPOUT)


@functools.cache
def one_device(name: str, dtype: str) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """The reference's single device on CONFIGS[name] and its batch: (logits, loss, gradients),
    NumPy's (float64 or float32), which every backend's sharded step is held to. Shared: read only."""
    import numpy_impl

    config, batch = CONFIGS[name], batch_of(CONFIGS[name])
    model = numpy_impl.build_model(config, params_of(config, dtype))
    logits = model(*(batch[k] for k in batch if k not in ("tgt_out", "targets"))).logits
    return (logits, *numpy_impl.loss_and_grads(model, batch))


@functools.cache
def one_device_training(name: str) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The reference's single device trained STEPS Adam steps on adam_config(name): (each step's
    loss, the final weights, Adam's final moments by checkpoint name). Shared: read only."""
    import numpy_impl

    config, states = adam_config(name), []
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = numpy_impl.train(model, [batch_of(config)], STEPS, schedule(config), checkpoint=states.append,
                              checkpoint_every=STEPS)  # fmt: skip
    return np.array(losses), numpy_impl.to_params(model), states[-1].moments


def gradient_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray], dtype: str) -> float:
    """The worst tensor's max |diff| / max(its max |grad|, FLOOR * the model's max |grad|)."""
    assert list(got) == list(want)
    scale = max(float(np.abs(g).max()) for g in want.values())
    return max(
        float(np.abs(got[name].astype(np.float64) - want[name]).max())
        / max(float(np.abs(want[name]).max()), FLOOR[dtype] * scale)
        for name in want
    )


# ------------------------------------------------------------------------ sharded checkpoints
# A run saved at step SAVE_AT and resumed, held to RESUMED_STEPS steps never stopped (NumPy's, the reference).
SAVE_AT, RESUMED_STEPS = 3, 6


def checkpoint_train(plan: Plan, steps: int, **options):
    """NumPy's sharded run of ``steps`` Adam steps on adam_config("llama") -> (losses, weights)."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train

    config = adam_config("llama")
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = sharded_train(model, [batch_of(config)], steps, schedule(config), plan=plan, **options)
    return np.array(losses), numpy_impl.to_params(model)


@functools.cache
def uninterrupted() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """RESUMED_STEPS steps on one device, never stopped: the curve and weights every resumed run must give."""
    return checkpoint_train(Plan(), RESUMED_STEPS)


def assert_uninterrupted(losses, weights: dict[str, np.ndarray], what: str) -> None:
    """``losses`` and ``weights`` after RESUMED_STEPS are ``uninterrupted()``'s: the losses within 1e-12,
    every tensor within 1e-12 of its largest entry (float64)."""
    from transformer_backends.tolerances import TOLERANCE, max_relative_difference

    want_losses, want_weights = uninterrupted()
    np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE["float64"], atol=0, err_msg=what)
    worst = max(max_relative_difference(weights[n], w) for n, w in want_weights.items())
    assert worst <= TOLERANCE["float64"], f"{what}: weights after {RESUMED_STEPS} steps differ by {worst:.2e}"
