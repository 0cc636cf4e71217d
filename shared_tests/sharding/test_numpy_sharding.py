"""NumPy's sharded step is the single-device step: every plan (FSDP, tensor parallel, FSDP x tensor
parallel, data parallel x tensor parallel) on the Llama-style decoder and on the paper's
encoder-decoder gives one device's logits, loss and gradients, and 20 Adam steps its weights; with
dropout, 3 Adam steps from the same seed are one device's (each device draws the one device's masks
and keeps its part), at a cost in random numbers measured per device; each step runs the
collectives the plan names; FSDP over 4 devices holds under 0.3 of one device's bytes;
a sharded run's checkpoint (whole tensors, canonical names) loads into every backend.

The batch is padded unevenly, so that a data rank's loss must be weighed by its share of the global
count of targets (data_parallel.py)."""

from __future__ import annotations

import functools

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
    step_dropout_draws,
)
from numpy_impl.train import dropout_streams
from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run.checkpoint import load_checkpoint, save_checkpoint
from transformer_run.sharding import Plan, fsdp_units, plan_weights
from transformer_spec import Config, init_params, param_schema

from .cases import (
    CONFIGS,
    DROPOUT_SEED,
    DROPOUT_STEPS,
    LLAMA,
    PLANS,
    STEPS,
    adam_config,
    batch_of,
    dropout_config,
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


@functools.cache
def one_device_with_dropout(name: str) -> tuple[list[float], dict[str, np.ndarray], list, list]:
    """The single device trained DROPOUT_STEPS Adam steps with dropout from DROPOUT_SEED: (each step's
    loss, the final weights, each step's checkpoint's dropout streams, the model's at the end)."""
    config, states = dropout_config(name), []
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = numpy_impl.train(model, [batch_of(config)], DROPOUT_STEPS, schedule(config), seed=DROPOUT_SEED,
                              checkpoint=states.append, checkpoint_every=1)  # fmt: skip
    return losses, numpy_impl.to_params(model), [s.dropout for s in states], dropout_streams(model)


@pytest.mark.parametrize("plan_name", [*PLANS, "dp"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_with_dropout_every_plan_is_the_single_device_run_with_the_same_seed(config_name, plan_name):
    """Dropout 0.1, 3 float64 Adam steps from seed 5: every step's loss to 1e-12, the weights per
    tensor within 1e-12 of its largest entry, and every step's checkpoint's dropout streams (and the
    model's at the end) exactly one device's: each device draws the one device's mask of the whole
    activation and keeps its part (``WholeMaskDropout``: its rows, heads or hidden features), so one
    device resumed from the sharded run's first checkpoint draws the masks it would have drawn: the
    same losses. Data parallel alone ("dp") too. The masks matter: without dropout the losses
    differ."""
    config = dropout_config(config_name)
    plan = PLANS.get(plan_name, Plan(data_parallel=2))
    want_losses, want, want_streams, want_end = one_device_with_dropout(config_name)
    model, saved = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64")), []

    def checkpoint(state) -> None:  # the state and the weights it goes with
        saved.append((state, numpy_impl.to_params(model)))

    losses = sharded_train(model, [batch_of(config)], DROPOUT_STEPS, schedule(config), seed=DROPOUT_SEED,
                           plan=plan, checkpoint=checkpoint, checkpoint_every=1)  # fmt: skip
    np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE["float64"])
    got = numpy_impl.to_params(model)
    worst = max(max_relative_difference(got[name], want[name]) for name in want)
    assert worst <= TOLERANCE["float64"], f"{plan}: weights after {DROPOUT_STEPS} steps differ by {worst:.2e}"
    assert [state.dropout for state, _ in saved] == want_streams, "the checkpoints' dropout streams"
    assert dropout_streams(model) == want_end
    state, weights = saved[0]  # one device resumes the sharded run after its first step: the same run
    resumed = numpy_impl.train(numpy_impl.build_model(config, weights), [batch_of(config)], DROPOUT_STEPS,
                               schedule(config), seed=DROPOUT_SEED, resume=state)  # fmt: skip
    np.testing.assert_allclose(resumed, want_losses, rtol=TOLERANCE["float64"])
    without_dropout = one_device_training(config_name)[0][:DROPOUT_STEPS]
    assert np.max(np.abs(np.array(want_losses) / without_dropout - 1)) > 1e-3


def dropout_numbers(config: Config, batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(the random numbers one device draws for one step's dropout masks, those of them inside a
    tensor-parallel block), from the shapes: each attention's weights (B, H, T_q, T_k) and each
    feed-forward's hidden features (B, T, d_ff) are inside a block; the embeddings' output and each
    sub-layer's output, (B, T, d_model) each, are whole on every model rank."""
    b, h, d, f = len(batch[next(iter(batch))]), config.num_heads, config.d_model, config.d_ff
    t = batch["tgt_in" if config.uses_encoder else "ids"].shape[1]
    s = batch["src_ids"].shape[1] if config.uses_encoder else None
    keys = [t, s] if config.decoder_has_cross_attention else [t]  # the decoder's attentions' T_k
    stacks = [(t, config.num_decoder_layers, keys)] + ([(s, config.num_encoder_layers, [s])] if s else [])
    inside = outside = 0
    for length, layers, key_lengths in stacks:
        outside += b * length * d  # the embeddings' output
        for _ in range(layers):
            inside += sum(b * h * length * k for k in key_lengths) + b * length * f
            outside += (len(key_lengths) + 1) * b * length * d  # each sub-layer's output
    return outside + inside, inside


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_each_device_draws_one_devices_random_numbers_and_keeps_its_share(config_name):
    """The cost of drawing the one device's masks (``step_dropout_draws``, device 0 in one step):
    under every plan it draws every random number one device draws, and keeps 1/D of those of the
    masks whole along ``model`` and 1/(D K) of those inside a tensor-parallel block (D data ranks,
    K model ranks): each device draws D times (D K times) its share."""
    config = dropout_config(config_name)
    model, batch = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64")), batch_of(config)
    total, inside = dropout_numbers(config, batch)
    one = step_dropout_draws(model, batch, Plan())
    assert one["drawn"] == one["kept"] == total
    for plan in [*PLANS.values(), Plan(data_parallel=2), Plan(fsdp=4), Plan(data_parallel=4, tensor_parallel=2)]:
        draws = step_dropout_draws(model, batch, plan)
        d, k = plan.data, plan.tensor_parallel
        assert draws == {"masks": one["masks"], "drawn": total, "kept": (total - inside) // d + inside // (d * k)}


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
