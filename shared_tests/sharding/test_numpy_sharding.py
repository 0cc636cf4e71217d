"""NumPy's sharded step is the single-device step: every plan (FSDP, tensor parallel, FSDP x tensor
parallel, data parallel x tensor parallel) on the Llama-style decoder and on the paper's
encoder-decoder gives one device's logits, loss and gradients, and 20 Adam steps its weights; each
step runs the collectives the plan names; FSDP over 4 devices holds under 0.3 of one device's bytes;
a sharded run's checkpoint (whole tensors, canonical names) loads into every backend.

The batch is padded unevenly, so that a data rank's loss must be weighed by its share of the global
count of targets (data_parallel.py)."""

from __future__ import annotations

import numpy as np
import pytest

import numpy_impl
from numpy_impl.sharding import (
    ShardedRun,
    all_gather,
    all_reduce,
    reduce_scatter,
    sharded_loss_and_grads,
    sharded_train,
    step_collectives,
)
from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run.checkpoint import load_checkpoint, save_checkpoint
from transformer_run.sharding import Plan, fsdp_units, plan_weights
from transformer_spec import Config, init_params, param_schema

from .cases import (
    CONFIGS,
    LLAMA,
    PLANS,
    STEPS,
    adam_config,
    batch_of,
    gradient_error,
    one_device,
    one_device_training,
    params_of,
    schedule,
)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_every_plan_gives_the_single_device_logits_loss_and_gradients(config_name, plan_name, dtype):
    config, plan = CONFIGS[config_name], PLANS[plan_name]
    model = numpy_impl.build_model(config, params_of(config, dtype))
    batch = batch_of(config)
    want_logits, want_loss, want = one_device(config_name, dtype)
    run = ShardedRun(model, plan)
    _, logits = run.loss_and_grads(batch)  # every data rank's rows, in order
    assert max_relative_difference(logits, want_logits) <= TOLERANCE[dtype]
    loss, grads = sharded_loss_and_grads(model, batch, plan)
    assert abs(loss - want_loss) / want_loss <= TOLERANCE[dtype]
    assert all(g.dtype == np.dtype(dtype) for g in grads.values())
    error = gradient_error(grads, want, dtype)
    assert error <= TOLERANCE[dtype], f"{plan}: gradients differ by {error:.2e}"


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_twenty_float64_adam_steps_give_the_single_device_weights(config_name, plan_name):
    """Every tensor to 1e-12 of its largest entry (the model without attention biases: adam_config)."""
    config = adam_config(config_name)
    want_losses, want, _ = one_device_training(config_name)
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = sharded_train(model, [batch_of(config)], STEPS, schedule(config), plan=PLANS[plan_name])
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    got = numpy_impl.to_params(model)
    worst = max(max_relative_difference(got[name], want[name]) for name in want)
    assert worst <= TOLERANCE["float64"], f"weights after {STEPS} Adam steps differ by {worst:.2e}"
    assert want_losses[-1] < want_losses[0]


def expected_collectives(config: Config, plan: Plan) -> dict[str, int]:
    """What one device runs per step, counted from the model's blocks: Megatron's all-reduce after each
    row-split block in the forward and one per input in the backward (cross-attention has two: the
    decoder's and the memory's, key and value together); FSDP's all-gather of each layer before its
    forward and again before its backward, of the rest once, and a reduce-scatter of each unit's
    gradients; data parallel's all-reduce of each unit's gradients; with more than one data rank, the
    all-reduce of the target count and of the loss."""
    layers = len(fsdp_units(config)) - 1
    counts = {"all-gather": 0, "reduce-scatter": 0, "all-reduce": 0}
    if plan.tensor_parallel > 1:
        blocks = 2 * layers  # an attention and a feed-forward each
        cross = config.num_decoder_layers if config.decoder_has_cross_attention else 0
        counts["all-reduce"] += 2 * blocks + 3 * cross
    if plan.fsdp > 1:
        counts["all-gather"] += 2 * layers + 1
        counts["reduce-scatter"] += layers + 1
    if plan.data_parallel > 1:
        counts["all-reduce"] += layers + 1
    if plan.data > 1:
        counts["all-reduce"] += 2
    return {kind: n for kind, n in counts.items() if n}


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_each_step_runs_the_collectives_its_plan_names(config_name, plan_name):
    config, plan = CONFIGS[config_name], PLANS[plan_name]
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float32"))
    counted = step_collectives(model, batch_of(config), plan)
    assert {kind: c["count"] for kind, c in counted.items()} == expected_collectives(config, plan)
    if plan.fsdp > 1:  # each gradient reduce-scattered whole once; each layer's weights gathered twice
        local = ShardedRun(model, plan).piece_shape
        nbytes = {n: 4 * int(np.prod(local(n))) * plan.fsdp for n in param_schema(config)}
        rest = sum(nbytes[n] for n in dict(fsdp_units(config))[""])
        assert counted["reduce-scatter"]["bytes"] == sum(nbytes.values())
        assert counted["all-gather"]["bytes"] == 2 * (sum(nbytes.values()) - rest) + rest


def test_the_collectives_add_up_and_concatenate_in_rank_order():
    parts = [np.arange(4.0) + 10 * r for r in range(3)]
    gathered = all_gather(parts)
    assert all(np.array_equal(g, np.concatenate(parts)) for g in gathered)
    assert gathered[0] is not gathered[1]  # each rank its own copy
    total = parts[0] + parts[1] + parts[2]
    assert all(np.array_equal(r, total) for r in all_reduce(parts))
    wide = [np.arange(6.0) * (r + 1) for r in range(3)]
    scattered = reduce_scatter(wide)
    assert [s.tolist() for s in scattered] == [p.tolist() for p in np.split(wide[0] + wide[1] + wide[2], 3)]


def test_fsdp_over_4_devices_holds_under_a_third_of_one_devices_weights_gradients_and_moments():
    """Each device keeps a quarter of every weight, gradient and moment, plus the whole weights and
    gradients of one layer at a time and of the rest (embeddings, final norm) for the step: with
    twelve layers, about 0.28 of one device's bytes, measured at each device's peak."""
    config = LLAMA.replace(num_decoder_layers=12)
    params = init_params(config, seed=0, dtype="float32")
    one_device = 4 * sum(p.nbytes for p in params.values())  # weights, gradients, Adam's m and v
    run = ShardedRun(numpy_impl.build_model(config, params), Plan(fsdp=4))
    run.step(batch_of(config))
    peaks = run.peak_bytes()
    assert len(peaks) == 4
    assert max(peaks) <= 0.3 * one_device, f"{max(peaks) / one_device:.3f} of one device"
    assert min(peaks) > one_device / 4  # it does hold more than its quarter, for a while


def test_a_sharded_checkpoint_holds_whole_tensors_every_backend_loads(backend, tmp_path):
    config = adam_config("paper")
    params = init_params(config, seed=0, dtype="float64")
    path = tmp_path / "sharded.safetensors"
    model = numpy_impl.build_model(config, params)

    def checkpoint(state) -> None:
        save_checkpoint(str(path), config, numpy_impl.to_params(model), state, {"plan": "fsdp 2 x tp 2"})

    plan = PLANS["fsdp-x-tp"]
    sharded_train(model, [batch_of(config)], 3, schedule(config), plan=plan, checkpoint=checkpoint)
    single = numpy_impl.build_model(config, params)
    numpy_impl.train(single, [batch_of(config)], 3, schedule(config), checkpoint=lambda s: setattr(single, "state", s))
    saved = load_checkpoint(str(path))
    assert set(saved.params) == set(param_schema(config)) == set(plan_weights(config, plan))
    loaded = backend.impl.to_params(backend.impl.load_model(str(path), dtype="float64"))
    want = numpy_impl.to_params(single)
    for name in want:
        assert loaded[name].shape == want[name].shape
        assert max_relative_difference(loaded[name], want[name]) <= TOLERANCE["float64"], name
    for name, moment in single.state.moments.items():  # Adam's moments whole too, as one device's
        assert max_relative_difference(saved.state.moments[name], moment) <= TOLERANCE["float64"], name
    assert saved.state.step == 3
