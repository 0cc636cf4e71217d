"""bf16 mixed precision: float32 master weights, bf16 compute, held to error budgets (not tolerances).

torch runs its own ``torch.autocast``, JAX Flax's compute dtype, NumPy emulates either with
``ml_dtypes`` (transformer_run.mixed_precision has the two policies and the budgets). Each is held
to the float32 reference on logits and gradients, the backends to each other (NumPy's autocast to
torch, NumPy's compute dtype to JAX, torch to JAX), a bf16 training run to the float32 loss curve;
and every error must stay above a floor, or the pass did not run in bf16 at all.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

from bench import bf16_cases as cases
from bench.bf16_cases import CONFIGS, PAIRS, RUNS, copy_batches, float32_reference
from transformer_run.mixed_precision import BUDGET, FLOOR, ROUNDING_MULTIPLE, gradients_error, relative_error
from transformer_spec import init_params

from ..helpers import padded_batch


def module(backend: str, name: str):
    try:
        return importlib.import_module(f"{backend}_impl.{name}")
    except ImportError as error:
        pytest.skip(f"backend {backend!r} is not installed ({error.name})")


def bf16_run(name: str, backend: str, policy: str):
    module(backend, "mixed_precision")  # skips when the backend is missing
    return cases.bf16_run(name, backend, policy)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("backend, policy", RUNS, ids=[f"{b}-{p}" for b, p in RUNS])
def test_bf16_logits_and_gradients_are_within_the_budget_of_float32(name, backend, policy):
    want_logits, want_loss, want_grads = float32_reference(name)
    logits, loss, grads = bf16_run(name, backend, policy)
    assert logits.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())  # the master dtype
    logits_error, grads_error = relative_error(logits, want_logits), gradients_error(grads, want_grads)
    assert FLOOR < logits_error <= BUDGET["logits"], f"logits: {logits_error:.2e}"
    assert FLOOR < grads_error <= BUDGET["gradients"], f"gradients: {grads_error:.2e}"
    assert abs(loss - want_loss) / want_loss <= BUDGET["logits"]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("backend, policy", RUNS, ids=[f"{b}-{p}" for b, p in RUNS])
def test_bf16_costs_a_few_times_what_rounding_the_weights_alone_costs(name, backend, policy):
    # every policy multiplies by bf16 weights: its error is held to a multiple of that rounding's own
    floor_logits, floor_grads = cases.rounding_floor(name)
    want_logits, _, want_grads = float32_reference(name)
    logits, _, grads = bf16_run(name, backend, policy)
    assert FLOOR < floor_logits and FLOOR < floor_grads
    assert relative_error(logits, want_logits) <= ROUNDING_MULTIPLE * floor_logits
    assert gradients_error(grads, want_grads) <= ROUNDING_MULTIPLE * floor_grads


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("first, second", PAIRS, ids=[f"{a[0]}-{a[1]}-vs-{b[0]}" for a, b in PAIRS])
def test_the_backends_agree_with_each_other_within_the_bf16_budget(name, first, second):
    logits_a, _, grads_a = bf16_run(name, *first)
    logits_b, _, grads_b = bf16_run(name, *second)
    assert relative_error(logits_a, logits_b) <= BUDGET["logits"]
    assert gradients_error(grads_a, grads_b) <= BUDGET["gradients"]


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_a_bf16_training_run_follows_the_float32_loss_curve(backend):
    module(backend, "train")
    gap = cases.curve_gap(backend)  # and it learns: the last loss under 0.8 x the first
    assert FLOOR < gap <= BUDGET["loss_curve"], f"{backend}: the bf16 curve is {gap:.2e} from float32's"


# ---------------------------------------------------------------- NumPy's emulation, op by op against torch's
def test_the_numpy_emulation_rounds_as_torch_does_op_by_op():
    """Elementwise ops and reductions in bf16 compute in float32 and round once, in torch and in the
    emulation, so they agree bit for bit; dtypes follow torch's promotion (bf16 with a float32 array
    is float32, with a Python scalar bf16); a matmul of bf16 operands sums in float32 (not bit for
    bit: the two sum in different orders) and returns bf16."""
    torch = pytest.importorskip("torch")
    from numpy_impl.mixed_precision import BF16, Bf16Compute

    rng = np.random.default_rng(0)
    a32, b32, w32 = rng.normal(size=(4, 8)), rng.normal(size=(4, 8)), rng.normal(size=(8,))
    a, b = (x.astype(np.float32).astype(BF16).view(Bf16Compute) for x in (a32, b32))
    w = w32.astype(np.float32).view(Bf16Compute)
    ta, tb = (torch.tensor(np.asarray(x, np.float32)).bfloat16() for x in (a, b))
    tw = torch.tensor(np.asarray(w))
    cases = {
        "a * b": (a * b, ta * tb),
        "a / 3.0": (a / 3.0, ta / 3.0),
        "a + w": (a + w, ta + tw),
        "exp(a)": (np.exp(a), torch.exp(ta)),
        "sqrt(|a|)": (np.sqrt(np.abs(a)), torch.sqrt(torch.abs(ta))),
        "a.sum(-1)": (a.sum(axis=-1), ta.sum(-1)),
        "a.max(-1)": (a.max(axis=-1), ta.amax(-1)),
        "where": (np.where(a > 0, a, -np.inf), torch.where(ta > 0, ta, -torch.inf)),
        # NumPy functions (not ufuncs) keep the emulation: their results compute by the same rules
        "swapaxes(a) / 3.0": (np.swapaxes(a, 0, 1) / 3.0, ta.T / 3.0),
        "concatenate * 2.0": (np.concatenate([a, b]) * 2.0, torch.cat([ta, tb]) * 2.0),
        "zeros_like(a) - a / 7.0": (np.zeros_like(a) - a / 7.0, torch.zeros_like(ta) - ta / 7.0),
    }
    for name, (got, want) in cases.items():
        assert str(got.dtype) == str(want.dtype).removeprefix("torch."), name
        assert np.array_equal(np.asarray(got, np.float32), want.float().numpy()), name
    product = a @ np.swapaxes(b, 0, 1)
    assert product.dtype == BF16
    want = (ta @ tb.T).float().numpy()
    ulp = np.abs(want) * 2.0**-7  # one bf16 ulp at most
    assert np.all(np.abs(np.asarray(product, np.float32) - want) <= ulp)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_bad_mixed_precision_options_are_refused_alike(backend):
    mixed = module(backend, "mixed_precision")
    params_module = importlib.import_module(f"{backend}_impl.params")
    config = CONFIGS["tiny-lm"]
    batch = padded_batch(config)
    model = params_module.build_model(config, init_params(config, seed=0), "float32")
    with pytest.raises(ValueError, match="compute_dtype must be one of bfloat16 or None, got 'float16'"):
        mixed.mixed_precision_loss_and_grads(model, batch, compute_dtype="float16")
    with pytest.raises(ValueError, match=f"{backend} runs the mixed-precision policy .*, got 'amp'"):
        mixed.mixed_precision_loss_and_grads(model, batch, policy="amp")
    if backend != "jax":  # JAX's float64 needs 64-bit mode, switched off in this process
        wide = params_module.build_model(config, init_params(config, seed=0), "float64")
        with pytest.raises(TypeError, match="mixed precision needs a float32 model .*, got float64"):
            mixed.mixed_precision_loss_and_grads(wide, batch)


def test_ml_dtypes_bfloat16_is_the_frameworks_bfloat16():
    """The cast float32 -> bf16 is the same rounding (to nearest, ties to even) everywhere."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).normal(size=10_000).astype(np.float32) * 10.0 ** np.arange(-4, 6).repeat(1000)
    ours = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(ours, torch.tensor(x).bfloat16().float().numpy())


# ---------------------------------------------------------------- the command line
def test_the_train_command_trains_in_bf16_near_the_float32_losses(capsys):
    from transformer_cli.main import main

    assert main(["train", "--task", "next-word", "--steps", "5"]) == 0
    single = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss: ")]
    assert main(["train", "--task", "next-word", "--steps", "5", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "numpy (bfloat16)" in out
    mixed = [line for line in out.splitlines() if line.startswith("loss: ")]
    assert len(single) == len(mixed) == 1 and mixed != single  # "loss: first 4.1234, last 3.2109"
    want, got = (np.array([float(word.rstrip(",")) for word in line.split()[2::2]]) for line in (*single, *mixed))
    assert np.all(np.abs(got - want) / want <= BUDGET["loss_curve"]), (single, mixed)


def test_the_train_command_trains_data_parallel_in_bf16(capsys):
    from transformer_cli.main import main

    argv = ["train", "--task", "next-word", "--steps", "5", "--dtype", "bfloat16"]
    assert main(argv) == 0
    single = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss: ")]
    assert main([*argv, "--data-parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "numpy (bfloat16)" in out and "data parallel over 2 replicas" in out
    parallel = [line for line in out.splitlines() if line.startswith("loss: ")]
    want, got = (np.array([float(word.rstrip(",")) for word in line.split()[2::2]]) for line in (*single, *parallel))
    assert np.all(np.abs(got - want) / want <= BUDGET["loss_curve"]), (single, parallel)


@pytest.mark.parametrize("shards", [2, 4])
def test_numpy_data_parallel_in_bf16_is_the_bf16_step_up_to_each_shards_rounding(shards):
    """The loss is the same (float32 sums of the same bf16 logits); the gradients differ by bf16's
    rounding of each shard's own gradient (a weight's gradient is a bf16 matmul over the shard's
    rows, rounded once per shard, then summed in float32), as DDP's replicas' do under autocast."""
    import numpy_impl
    from numpy_impl.mixed_precision import mixed_precision_loss_and_grads

    config = CONFIGS["tiny-lm"]
    model = numpy_impl.build_model(config, init_params(config, seed=0), "float32")
    batch = padded_batch(config)
    want_loss, want = mixed_precision_loss_and_grads(model, batch)
    loss, grads = numpy_impl.data_parallel_loss_and_grads(model, batch, shards, compute_dtype="bfloat16")
    assert abs(loss - want_loss) / want_loss <= 1e-6
    assert FLOOR < gradients_error(grads, want) <= BUDGET["gradients"]


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_bf16_training_draws_new_dropout_masks_each_step_reproducibly(backend):
    """JAX runs a copy of the model in bf16: its dropout streams must be written back, or every step
    would draw the first step's masks. At learning rate 0 the losses differ by the masks alone."""
    train = module(backend, "train")
    params_module = importlib.import_module(f"{backend}_impl.params")
    from transformer_run.schedules import constant_schedule

    config = CONFIGS["tiny-llama"].replace(dropout=0.3)
    batch = copy_batches(config)[:1]

    def run() -> list[float]:
        model = params_module.build_model(config, init_params(config, seed=0), "float32")
        return train.train(model, batch, 3, constant_schedule(0.0), seed=1, compute_dtype="bfloat16")

    losses = run()
    assert len(set(losses)) == 3 and run() == losses


# Which dtype and which policy a bf16 pass ran under, read from what it computed: an error budget
# cannot tell bf16 from float16 (float16 is the more precise: it meets every bf16 budget and floor).
# The default policy is each framework's own; NumPy's default emulates torch.autocast.
DEFAULT_POLICY = {"numpy": "autocast", "torch": "autocast", "jax": "compute_dtype"}
FINGERPRINT_RUNS = [*RUNS, *((backend, None) for backend in DEFAULT_POLICY)]


def _bf16_trace(backend: str, policy: str | None):
    """Every named intermediate of a tiny language model's bf16 forward pass under ``policy``."""
    from transformer_backends import get_backend
    from transformer_spec import Config
    from transformer_spec.checks import inputs_checked

    mixed = module(backend, "mixed_precision")  # skips when the backend is missing
    b = get_backend(backend)
    config = Config.preset("tiny-lm")
    model = b.impl.build_model(config, init_params(config, seed=0))
    checked = model.check_inputs(b.asarray(np.array([[5, 17, 3, 29, 8, 11]])))
    if backend == "jax":  # Flax's compute dtype: a bf16 copy of the model (jax_impl.mixed_precision)
        mixed.check_policy("jax", policy)
        with inputs_checked():
            return b.impl.trace_model(mixed.in_compute_dtype(model), *checked)
    options = {} if policy is None else {"policy": policy}
    with mixed.compute_in_bf16(model, **options), inputs_checked():
        return b.impl.trace_model(model, *checked)


def _in_bf16(x: np.ndarray) -> bool:
    x = np.asarray(x, np.float32)
    return bool(np.array_equal(x, x.astype(ml_dtypes.bfloat16).astype(np.float32)))


@pytest.mark.parametrize("backend, policy", FINGERPRINT_RUNS, ids=[f"{b}-{p or 'default'}" for b, p in FINGERPRINT_RUNS])
def test_a_bf16_pass_computes_in_bfloat16_under_its_policy(backend, policy):
    trace = _bf16_trace(backend, policy)
    policy = policy or DEFAULT_POLICY[backend]
    projection = trace["decoder.layers.0.self_attn.q"]  # a Linear layer's output: bf16 under every policy
    norm = trace["decoder.layers.0.self_attn_norm.output"]  # float32 under autocast, bf16 under compute_dtype
    # by value, not by dtype label (a torch bfloat16 tensor is recorded in float32, exactly): float16's
    # 11 significant bits or float32's 24 leave values that bfloat16's 8 cannot hold
    assert _in_bf16(projection), f"{backend}'s projection holds values bfloat16 cannot: not computed in bf16"
    assert not _in_bf16(projection.astype(np.float32) * (1 + 2.0**-10))  # the check can fail
    if policy == "autocast":  # torch.autocast runs normalisation in float32
        assert not _in_bf16(norm), f"{backend}'s autocast normalised in bf16, as the compute dtype does"
    else:  # Flax's dtype=bfloat16: every op, the norms too
        assert _in_bf16(norm), f"{backend}'s compute dtype normalised outside bf16"
