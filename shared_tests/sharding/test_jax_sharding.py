"""JAX's sharded step is the single-device step: FSDP, tensor parallel, FSDP x tensor parallel and
data parallel x tensor parallel (weights placed with ``NamedSharding`` on a ``("data", "model")``
mesh of simulated CPU devices; the step written out in ``shard_map``) on the Llama-style decoder and
the paper's encoder-decoder give one device's loss and gradients (float64, and float32 for the
pairs of ``cases.FLOAT32``) and 20 float64 Adam steps its losses and weights; the tensor-parallel
blocks written with ``shard_map`` give the jit version's output with one all-reduce (the psum); the
collectives of the compiled step are NumPy's written-out step's, kind by kind (where they differ,
counted and explained below); with dropout, every plan is JAX's own single device with the same
seed; FSDP's memory per device; a sharded run's checkpoint (whole tensors, canonical names) loads
into every backend.

The mesh's devices must be asked for before JAX starts, so two child processes, one per model, run
side by side (processes.py starts them: ``python -m shared_tests.sharding.test_jax_sharding child
FOLDER PART``), compute everything on 4 simulated devices and write it to .npz files; the tests
compare it with one device of the reference (NumPy's, computed here while the children run, and
shared with the other backends' sharding tests: ``cases.one_device``), except for dropout, whose
masks are JAX's own: its single device runs in the child too. The models, batches and plans are
NumPy's test's.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_spec import Config, init_params

from .cases import (
    CONFIGS,
    DROPOUT_SEED,
    DROPOUT_STEPS,
    FLOAT32,
    MEMORY_CASE,
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
from .processes import JAX_DEVICES as DEVICES
from .processes import jax_results

CHECKPOINTED = ("llama", "fsdp-x-tp")  # the run whose checkpoint every backend loads


# ------------------------------------------------------------------------------ the children
def child(folder: str, part: str) -> None:
    """On 4 simulated devices, for the model ``part`` (a name of CONFIGS): each plan's loss and
    gradients, 20 Adam steps (losses, final weights, a checkpoint), the collectives of its compiled
    step; then EXTRAS[part] (and for the Llama-style decoder test_jax_checkpoints.py's runs). Writes
    FOLDER/jax-PART.npz and FOLDER/jax-PART.collectives.json."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax_impl
    from jax_impl import sharding
    from transformer_run.checkpoint import save_checkpoint

    assert len(jax.devices()) == DEVICES, jax.devices()
    results, collectives = {}, {}
    model_name, config = part, CONFIGS[part]
    batch = batch_of(config)
    for plan_name, plan in PLANS.items():
        for dtype in ["float64"] + (["float32"] if (model_name, plan_name) in FLOAT32 else []):
            key = f"{model_name}/{plan_name}/{dtype}"
            model = jax_impl.build_model(config, params_of(config, dtype))
            loss, grads = sharding.sharded_loss_and_grads(model, batch, plan)
            results[f"{key}/loss"] = loss
            results |= {f"{key}/grad/{name}": grad for name, grad in grads.items()}
        trained = adam_config(model_name)
        model = jax_impl.build_model(trained, init_params(trained, seed=0, dtype="float64"))
        collectives[f"{model_name}/{plan_name}"] = sharding.step_collectives(model, batch, plan)
        key, checkpoint = f"{model_name}/{plan_name}/adam", None
        if (model_name, plan_name) == CHECKPOINTED:

            def checkpoint(state, model=model, config=trained, run={"plan": plan_name}):  # noqa: B006
                save_checkpoint(f"{folder}/jax-checkpoint", config, jax_impl.to_params(model), state, run)

        results[f"{key}/losses"] = sharding.sharded_train(
            model, [batch], STEPS, schedule(trained), plan=plan, checkpoint=checkpoint
        )
        results |= {f"{key}/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
    for extra in EXTRAS[part]:
        results |= extra()
    if part == "llama":  # test_jax_checkpoints.py's runs: its tensor-parallel programs compiled above
        from .jax_checkpoint_runs import checkpoint_runs

        results |= checkpoint_runs(folder)
    np.savez(f"{folder}/jax-{part}.npz", **results)
    pathlib.Path(f"{folder}/jax-{part}.collectives.json").write_text(json.dumps(collectives))


def fsdp_memory() -> dict[str, np.ndarray]:
    """What XLA allocates for one device's training step under FSDP over 4 devices on MEMORY_CASE,
    and one device's weights, gradients and Adam moments, float32."""
    import jax_impl
    from jax_impl import sharding
    from transformer_run.sharding import Plan

    params = init_params(MEMORY_CASE, seed=0, dtype="float32")
    model = jax_impl.build_model(MEMORY_CASE, params)
    held = sharding.step_memory(model, batch_of(MEMORY_CASE), Plan(fsdp=4))
    results = {f"fsdp-4/{key}": np.array(value) for key, value in held.items()}
    results["fsdp-4/one"] = np.array(4 * sum(p.nbytes for p in params.values()))  # weights, grads, m, v
    return results


# Dropout's runs, (model, plan) by the child that runs them (each is a program of its own to compile,
# shared out so that the two children take about as long): every plan on the Llama-style decoder
# (FSDP's rows, tensor parallel's heads and features, both in one shard_map), FSDP x tensor parallel
# on the encoder-decoder (its cross-attention's heads too), and each model's single device
DROPOUT_RUNS = {
    "llama": (("llama", "fsdp"), ("llama", "tp"), ("llama", "fsdp-x-tp")),
    "paper": (("llama", "one-device"), ("llama", "dp-x-tp"), ("paper", "one-device"), ("paper", "fsdp-x-tp")),
}


def with_dropout(part: str) -> dict[str, np.ndarray]:
    """DROPOUT_RUNS[part]: DROPOUT_STEPS Adam steps with dropout from DROPOUT_SEED under the plan, or
    on one device (JAX's own: the masks are each framework's generator's): each step's loss, the final
    weights and the dropout streams where they stand (JSON)."""
    import jax_impl
    from jax_impl import sharding
    from jax_impl.train import dropout_streams

    results = {}
    for model_name, plan_name in DROPOUT_RUNS[part]:
        config, key = dropout_config(model_name), f"dropout/{model_name}/{plan_name}"
        model = jax_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
        train = jax_impl.train if plan_name == "one-device" else functools.partial(
            sharding.sharded_train, plan=PLANS[plan_name])  # fmt: skip
        losses = train(model, [batch_of(config)], DROPOUT_STEPS, schedule(config), seed=DROPOUT_SEED)
        results[f"{key}/losses"] = np.array(losses)
        results |= {f"{key}/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
        results[f"{key}/streams"] = np.array(json.dumps(dropout_streams(model)))
    return results


def shard_map_blocks() -> dict[str, np.ndarray]:
    """The first decoder layer's self-attention (with a causal mask) and feed-forward of both models,
    tensor parallel over 2 devices: written with shard_map (its output, and the all-reduces of its
    compiled program; x's gradient, and its program's), and the plain block under jit with its weights
    sharded (GSPMD's version)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_impl
    from jax_impl import sharding

    plan = PLANS["tp"]
    mesh = sharding.sharding_mesh(plan)
    results = {}
    for model_name, config in CONFIGS.items():
        model = jax_impl.build_model(config, params_of(config, "float64"))
        layer = model.decoder.layers[0]
        x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 7, config.d_model)))  # (B, T, d_model)
        mask = jax_impl.make_causal_mask(7)  # (1, 1, T, T)
        for block_name, block in (("attention", layer.self_attn), ("ffn", layer.ffn)):
            key = f"{model_name}/{block_name}"
            block_mask = mask if block_name == "attention" else None
            explicit = jax.jit(lambda x, block=block, m=block_mask: sharding.tensor_parallel_block(block, x, mesh, m))
            compiled = explicit.lower(x).compile()
            results[f"{key}/shard_map"] = np.asarray(compiled(x))
            counted = sharding.hlo_collectives(compiled.as_text())
            results[f"{key}/shard_map-all-reduces"] = counted["all-reduce"]["count"]
            # the sum and x's gradient: the forward's psum, and one all-reduce of the parts of x's gradient
            grad = jax.jit(jax.value_and_grad(lambda x, block=block, m=block_mask: sharding.tensor_parallel_block(
                block, x, mesh, m).sum())).lower(x).compile()  # fmt: skip
            results[f"{key}/shard_map-grad"] = np.asarray(grad(x)[1])
            results[f"{key}/shard_map-grad-all-reduces"] = sharding.hlo_collectives(grad.as_text())["all-reduce"][
                "count"
            ]
            sharding.shard_model(block, mesh, plan)  # the same weights, sharded: GSPMD's version
            if block_name == "attention":
                results[f"{key}/jit"] = np.asarray(nnx.jit(lambda block, x, m=mask: block(x, x, x, m)[0])(block, x))
            else:
                results[f"{key}/jit"] = np.asarray(nnx.jit(lambda block, x: block(x))(block, x))
            sharding.gather(block)
            results[f"{key}/x"] = np.asarray(x)
    return results


# what else each child computes, after its model's plans (and its share of dropout's runs)
EXTRAS = {
    "llama": (fsdp_memory, functools.partial(with_dropout, "llama")),
    "paper": (shard_map_blocks, functools.partial(with_dropout, "paper")),
}


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def sharded(sharded_runs):
    """The children (processes.py starts them once per test run)."""
    if not sharded_runs.available("jax"):
        pytest.skip("jax is not installed")
    return sharded_runs["jax"]


results_of = jax_results  # the children's arrays, their collectives, their folder


@pytest.mark.parametrize("model_name", list(CONFIGS))
def test_every_plan_gives_the_single_device_loss_and_gradients(sharded, model_name):
    """Against one device of the reference (NumPy, which JAX's own single device equals to ~1e-15
    in the parity suite): within 1e-12 in float64, 1e-5 in float32."""
    results, _, _ = results_of(sharded)
    for plan_name in PLANS:
        for dtype in ("float64", "float32"):
            key = f"{model_name}/{plan_name}/{dtype}"
            if dtype == "float32" and (model_name, plan_name) not in FLOAT32:
                continue
            _, want_loss, want_grads = one_device(model_name, dtype)
            assert abs(float(results[f"{key}/loss"]) - want_loss) / want_loss <= TOLERANCE[dtype], key
            grads = {name: results[f"{key}/grad/{name}"] for name in want_grads}
            assert all(g.dtype == np.dtype(dtype) for g in grads.values()), key
            error = gradient_error(grads, want_grads, dtype)
            assert error <= TOLERANCE[dtype], f"{key}: gradients differ by {error:.2e}"


@pytest.mark.parametrize("model_name", list(CONFIGS))
def test_twenty_float64_adam_steps_give_the_single_device_losses_and_weights(sharded, model_name):
    """Adam's moments are sharded like the weights; every tensor to 1e-12 of its largest entry of
    the reference's single device after the same steps."""
    want_losses, want, _ = one_device_training(model_name)
    results, _, _ = results_of(sharded)
    for plan_name in PLANS:
        key = f"{model_name}/{plan_name}/adam"
        np.testing.assert_allclose(results[f"{key}/losses"], want_losses, rtol=TOLERANCE["float64"], err_msg=key)
        worst = max(max_relative_difference(results[f"{key}/weight/{name}"], want[name]) for name in want)
        assert worst <= TOLERANCE["float64"], f"{key}: weights after {STEPS} Adam steps differ by {worst:.2e}"


def test_a_sharded_runs_checkpoint_holds_whole_tensors_every_backend_loads(sharded):
    """The FSDP x tensor parallel run's checkpoint: canonical names, whole tensors, the run's losses;
    each installed backend loads it and holds the sharded run's final weights."""
    from transformer_backends.names import BACKENDS
    from transformer_run.checkpoint import load_checkpoint
    from transformer_spec import param_schema

    results, _, out = results_of(sharded)
    model_name, plan_name = CHECKPOINTED
    key = f"{model_name}/{plan_name}/adam"
    saved = load_checkpoint(str(out / "jax-checkpoint"))
    assert saved.state.step == STEPS and saved.run == {"plan": plan_name}
    assert saved.state.losses == list(results[f"{key}/losses"])
    assert {n: w.shape for n, w in saved.params.items()} == param_schema(adam_config(model_name))
    assert {n for n in saved.state.moments} == {f"{m}.{n}" for m in "mv" for n in saved.params}
    for backend_name in BACKENDS:
        if importlib.util.find_spec(backend_name) is None:
            continue
        impl = importlib.import_module(f"{backend_name}_impl")
        loaded = impl.to_params(impl.build_model(saved.config, saved.params, "float64"))
        for name, weight in loaded.items():
            assert np.array_equal(np.asarray(weight), results[f"{key}/weight/{name}"]), f"{backend_name}: {name}"


@pytest.mark.parametrize("model_name", list(CONFIGS))
def test_the_shard_map_blocks_equal_the_jit_blocks_and_one_device_with_megatrons_all_reduces(sharded, model_name):
    """Self-attention (grouped-query in the Llama-style decoder: 3 query heads and their 1 key/value
    head on each device) and the feed-forward, the biases random (added once, after the psum):
    the output with one all-reduce, x's gradient with one more; against the reference's block
    (NumPy's, its backward written out)."""
    import numpy_impl
    from numpy_impl.module import enable_grad

    config = CONFIGS[model_name]
    layer = numpy_impl.build_model(config, params_of(config, "float64")).decoder.layers[0]
    results, _, _ = results_of(sharded)
    x = results[f"{model_name}/attention/x"]
    want, grads = {}, {}
    with enable_grad():  # the forwards keep what the backwards read
        want["attention"] = layer.self_attn(x, x, x, numpy_impl.make_causal_mask(x.shape[1]))[0]
        want["ffn"] = layer.ffn(x)
    # x's gradient of the output's sum (a self-attention's: through the query, the key and the value)
    grads["attention"] = layer.self_attn.self_attention_backward(np.ones_like(want["attention"]))[0]
    grads["ffn"] = layer.ffn.backward(np.ones_like(want["ffn"]))[0]
    for block, output in want.items():
        for version in ("shard_map", "jit"):
            error = max_relative_difference(results[f"{model_name}/{block}/{version}"], output)
            assert error <= TOLERANCE["float64"], f"{model_name} {block}: {version} differs by {error:.2e}"
        assert int(results[f"{model_name}/{block}/shard_map-all-reduces"]) == 1
    for block, grad in grads.items():
        error = max_relative_difference(results[f"{model_name}/{block}/shard_map-grad"], grad)
        assert error <= TOLERANCE["float64"], f"{model_name} {block}: x's gradient differs by {error:.2e}"
        # the forward's all-reduce, and one for x's gradient (q, k and v's parts added first)
        assert int(results[f"{model_name}/{block}/shard_map-grad-all-reduces"]) == 2


def two_buffer_units(config: Config, plan) -> int:
    """The units that travel in two buffers under ``plan`` (``gather_unit``): with the batch split
    over ``data`` and tensor parallel, those holding weights split over ``model`` beside weights
    whole along it; NumPy's devices send one."""
    from transformer_run.sharding import fsdp_units, placement
    from transformer_spec import param_schema

    if plan.data == 1 or plan.tensor_parallel == 1:
        return 0
    shapes = param_schema(config)
    kinds = [{placement(n, shapes[n], plan).model_dim is None for n in names} for _, names in fsdp_units(config)]
    return sum(len(kind) == 2 for kind in kinds)


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("model_name", list(CONFIGS))
def test_the_compiled_step_runs_numpys_collectives_as_xla_rewrites_them(sharded, model_name, plan_name):
    """XLA's step, read from the compiled program, against NumPy's written-out step, kind by kind,
    count and bytes. NumPy counts buffers: FSDP gathers one flat buffer per unit (each layer; the
    rest of the model) before its forward, a layer's again before its backward, and
    reduce-scatters one per unit; data parallel all-reduces one per unit; Megatron adds a block's
    input gradients on each device, then all-reduces once; the loss and the target count are
    all-reduced. JAX writes the same step out (``data_sharded_loss``, in ``shard_map``; each
    unit's buffer made whole by ``gather_unit``, whose transposes JAX derives: the reduce-scatter,
    the all-reduce; each tensor-parallel block a ``TensorParallelBlock``), so:

    - FSDP alone and tensor parallel alone: NumPy's, collective by collective;
    - with tensor parallel and the batch split over ``data`` (FSDP x TP, DP x TP): the same bytes,
      Megatron's all-reduces, but a layer's pieces travel in two buffers (those split over
      ``model``, those whole along it: ``two_buffer_units``), so its gathers and its
      reduce-scatter (under data parallel, its all-reduce) are counted twice;
    - XLA's all-reduce combiner is off (``COMPILER_OPTIONS``), so each collective is its own
      instruction, none packed.
    """
    import numpy_impl
    from numpy_impl.sharding import step_collectives

    config, plan = adam_config(model_name), PLANS[plan_name]
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    reference = step_collectives(model, batch_of(config), plan)
    _, collectives, _ = results_of(sharded)
    counted = collectives[f"{model_name}/{plan_name}"]
    got = {kind: (c["count"], c["bytes"]) for kind, c in counted.items() if c["count"]}  # no other kind
    want = {kind: (c["count"], c["bytes"]) for kind, c in reference.items()}
    split = two_buffer_units(config, plan)
    if split and plan.fsdp > 1:  # before the forward and again before the backward; one gradient
        want["all-gather"] = (want["all-gather"][0] + 2 * split, want["all-gather"][1])
        want["reduce-scatter"] = (want["reduce-scatter"][0] + split, want["reduce-scatter"][1])
    elif split:  # data parallel: one gradient buffer more
        want["all-reduce"] = (want["all-reduce"][0] + split, want["all-reduce"][1])
    assert got == want, f"{model_name} {plan_name}: XLA runs {got}, the explanation says {want} (NumPy: {reference})"
    if not split:  # FSDP alone, tensor parallel alone: NumPy's exactly
        assert got == {kind: (c["count"], c["bytes"]) for kind, c in reference.items()}
    assert all(c["instructions"] == c["count"] for c in counted.values()), counted  # none packed


def test_with_dropout_every_plan_is_the_single_device_run_with_the_same_seed(sharded):
    """Dropout 0.1, 3 float64 Adam steps from seed 5, against JAX's own single device (each
    framework's masks are its generator's): every step's loss to 1e-12, the weights per tensor
    within 1e-12 of its largest entry, the dropout streams (a checkpoint's) exactly where one
    device's stand. Each device draws the one device's mask of the whole activation from the
    Dropout's own stream and keeps its part (``WholeMaskDropout``): its rows under FSDP and data
    parallel, its heads or hidden features inside a tensor-parallel block, both on the 2-D meshes.
    The masks matter: without dropout the losses differ."""
    results, _, _ = results_of(sharded)
    runs = [run for runs in DROPOUT_RUNS.values() for run in runs]
    for model_name, plan_name in (run for run in runs if run[1] != "one-device"):
        want, got = f"dropout/{model_name}/one-device", f"dropout/{model_name}/{plan_name}"
        np.testing.assert_allclose(results[f"{got}/losses"], results[f"{want}/losses"], rtol=TOLERANCE["float64"],
                                   err_msg=got)  # fmt: skip
        names = [key.removeprefix(f"{want}/weight/") for key in results if key.startswith(f"{want}/weight/")]
        worst = max(max_relative_difference(results[f"{got}/weight/{n}"], results[f"{want}/weight/{n}"])
                    for n in names)  # fmt: skip
        assert worst <= TOLERANCE["float64"], f"{got}: weights after {DROPOUT_STEPS} steps differ by {worst:.2e}"
        assert str(results[f"{got}/streams"]) == str(results[f"{want}/streams"]), f"{got}: the dropout streams"
    for model_name in {model_name for model_name, _ in runs}:
        without = one_device_training(model_name)[0][:DROPOUT_STEPS]
        assert np.max(np.abs(results[f"dropout/{model_name}/one-device/losses"] / without - 1)) > 1e-3


def test_fsdp_over_4_devices_allocates_under_0_3_of_one_devices_bytes(sharded):
    """Everything XLA allocates for one device's FSDP step over 4 devices (``step_memory``: its
    arguments, its quarter of the weights and Adam's moments and its rows of the batch; its
    temporaries, one layer's whole weights and gradient, the activations; its outputs, written over
    the donated weights and moments) against one device's weights, gradients and moments: under 0.3
    on MEMORY_CASE, twelve layers of 66 MB in all (0.25 measured). Measured on the way: with XLA's
    CSE on (``COMPILER_OPTIONS``), it merges each layer's second gather into its first and keeps
    every layer's whole weights from the forward to the backward (0.48); without donation the
    updated weights and moments are new buffers beside the old; on the same model at d_model 72
    (NumPy's memory case, 0.28 there without activations) XLA's fixed temporaries are a larger
    share (0.43)."""
    results, _, _ = results_of(sharded)
    total, one = int(results["fsdp-4/total"]), int(results["fsdp-4/one"])
    assert one / 4 < total <= 0.3 * one, f"{total / one:.3f} of one device"
    # the weights and moments updated in place: no second copy of them
    assert int(results["fsdp-4/aliased"]) >= 0.75 * one / 4, "not donated"


if __name__ == "__main__":  # a child: python -m shared_tests.sharding.test_jax_sharding child FOLDER PART
    child(sys.argv[2], sys.argv[3])
