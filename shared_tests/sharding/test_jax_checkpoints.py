"""JAX's sharded checkpoints (``jax_impl.sharded_checkpoint``: Orbax, each process writing its own
shards) resume under any plan: runs of the Llama-style decoder saved after step 3 under FSDP 4,
tensor parallel 2 and FSDP 2 x tensor parallel 2 are each resumed under those three plans and on one
device (12 runs), and each goes on to step 6 with the uninterrupted run's float64 losses and weights;
the restored weights and moments are placed by the new plan (each array's sharding its
``weight_spec``); a save killed before its commit leaves a ``step-N.partial`` folder that is never
read; ``whole_tensors`` reads the saved weights and moments whole, under the canonical names, without
a model, and they are the uninterrupted run's at step 3. Each checkpoint consolidated resumes in NumPy
under each plan and in torch on one device. And, in 4 processes of one device each (their own
launch), saving under FSDP 4 holds each process's own shards and no more than a tensor beside them.

The runs need 4 simulated devices, so they run in test_jax_sharding.py's child for the Llama-style
decoder (``checkpoint_runs``, after its own plans: the tensor-parallel programs are compiled there
already, and the uninterrupted run is tensor parallel's), which writes them into its .npz and its
checkpoint folders into FOLDER/jax-sharded/<plan>; the tests read both.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run.sharding import Plan

from .cases import adam_config, batch_of, one_device_training, schedule
from .jax_checkpoint_runs import KILLED, MODEL, RESUMED, SAVED, SAVED_AT, STEPS


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def runs(sharded_runs):
    """(the child's arrays, its folder): processes.py starts the children once per test run."""
    if not sharded_runs.available("jax"):
        pytest.skip("jax is not installed")
    from .processes import jax_results as results_of

    results, _, folder = results_of(sharded_runs["jax"])
    return results, folder


def _weights(results: dict[str, np.ndarray], key: str) -> dict[str, np.ndarray]:
    prefix = f"{key}/"
    return {k[len(prefix) :]: v for k, v in results.items() if k.startswith(prefix)}


def _assert_uninterrupted(results: dict[str, np.ndarray], losses, weights: dict[str, np.ndarray]) -> None:
    """A resumed run's losses of steps 1..STEPS and weights after them are the uninterrupted run's (the
    child's): within 1e-12, every tensor against its largest entry."""
    np.testing.assert_allclose(losses, results["checkpoints/reference/losses"], rtol=TOLERANCE["float64"])
    want = _weights(results, "checkpoints/reference/weight-end")
    assert max(max_relative_difference(weights[n], w) for n, w in want.items()) <= TOLERANCE["float64"]


def test_the_uninterrupted_run_is_the_reference_single_devices(runs):
    """The run every resumed one is held to: the reference's single device's first STEPS losses."""
    results, _ = runs
    want, _, _ = one_device_training(MODEL)
    np.testing.assert_allclose(results["checkpoints/reference/losses"], want[:STEPS], rtol=TOLERANCE["float64"])


@pytest.mark.parametrize("resumed", list(RESUMED))
@pytest.mark.parametrize("saved", list(SAVED))
def test_a_run_saved_under_one_plan_resumes_under_another_as_if_never_stopped(runs, saved, resumed):
    """Saved at step 3 under ``saved``, resumed under ``resumed``: the losses of steps 1..6 (the
    first three from training.json, the rest computed) and the weights after step 6 are the
    uninterrupted run's, every tensor within 1e-12 of its largest entry."""
    results, _ = runs
    key = f"checkpoints/{saved}/{resumed}"
    want = results["checkpoints/reference/losses"]
    np.testing.assert_allclose(results[f"{key}/losses"], want, rtol=TOLERANCE["float64"], err_msg=key)
    got, want = _weights(results, f"{key}/weight"), _weights(results, "checkpoints/reference/weight-end")
    assert list(got) == list(want), key
    worst = max(max_relative_difference(got[n], w) for n, w in want.items())
    assert worst <= TOLERANCE["float64"], f"{key}: weights after step {STEPS} differ by {worst:.2e}"


@pytest.mark.parametrize("resumed", list(RESUMED))
def test_numpy_s_checkpoint_consolidated_resumes_in_jax_under_each_plan(runs, resumed):
    """NumPy's run saved under FSDP 4 at step 3, made one file by ``consolidate``, resumed by JAX
    under ``resumed`` (its whole moments placed by the plan): the uninterrupted run's curve and
    weights."""
    test_a_run_saved_under_one_plan_resumes_under_another_as_if_never_stopped(runs, "numpy", resumed)


@pytest.mark.parametrize("resumed", list(RESUMED))
@pytest.mark.parametrize("saved", list(SAVED))
def test_jax_s_checkpoint_consolidated_resumes_in_numpy(runs, saved, resumed):
    """Each of JAX's checkpoints (Orbax's files) as one file (``consolidate``, run in the child),
    resumed by NumPy's reference under each plan: the uninterrupted run's curve and weights."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train
    from transformer_run.checkpoint import load_checkpoint

    results, folder = runs
    file = load_checkpoint(os.path.join(folder, "jax-sharded", f"{saved}.safetensors"))
    model = numpy_impl.build_model(file.config, file.params)
    losses = sharded_train(model, [batch_of(file.config)], STEPS, schedule(file.config), plan=RESUMED[resumed],
                           resume=file.state)  # fmt: skip
    _assert_uninterrupted(results, losses, numpy_impl.to_params(model))


@pytest.mark.parametrize("saved", list(SAVED))
def test_jax_s_checkpoint_consolidated_resumes_in_torch(runs, saved):
    """Each of JAX's checkpoints as one file, resumed by torch on one device (``train`` with the
    file's state): the uninterrupted run's curve and weights. (torch's sharded runs resume such a
    file under each plan in test_torch_checkpoints.py: NumPy's, consolidated.)"""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch_impl
    from transformer_run.checkpoint import load_checkpoint

    results, folder = runs
    file = load_checkpoint(os.path.join(folder, "jax-sharded", f"{saved}.safetensors"))
    model = torch_impl.build_model(file.config, file.params)
    losses = torch_impl.train(model, [batch_of(file.config)], STEPS, schedule(file.config), resume=file.state)
    _assert_uninterrupted(results, losses, torch_impl.to_params(model))


@pytest.mark.parametrize("resumed", list(RESUMED))
def test_restore_places_every_weight_and_moment_as_the_new_plan_does_and_sets_adams_step(runs, resumed):
    """Each restored array on the new plan's mesh, split by its ``weight_spec`` (not the saved
    plan's), and Adam's step (the schedule's position, optax's count) the checkpoint's."""
    results, _ = runs
    assert str(results[f"checkpoints/placed/{resumed}/misplaced"]) == "", results[
        f"checkpoints/placed/{resumed}/misplaced"
    ]
    assert list(results[f"checkpoints/placed/{resumed}/adam-step"]) == [SAVED_AT, SAVED_AT]


@pytest.mark.parametrize("saved", list(SAVED))
def test_whole_tensors_reads_the_saved_weights_and_moments_by_their_canonical_names(runs, saved):
    """Without a model, on the host: the uninterrupted run's weights and Adam's moments at step 3,
    canonical names (the moments "m.<name>", "v.<name>") and shapes; and training.json says what the
    run was."""
    from transformer_run.sharded_checkpoint import read
    from transformer_spec import param_schema

    results, folder = runs
    params = _weights(results, f"checkpoints/{saved}/whole/weight")
    moments = _weights(results, f"checkpoints/{saved}/whole/moment")
    schema = param_schema(adam_config(MODEL))
    assert {n: p.shape for n, p in params.items()} == {n: tuple(s) for n, s in schema.items()}
    assert list(params) == list(schema)  # the schema's order
    assert sorted(moments) == sorted(f"{which}.{n}" for which in "mv" for n in schema)
    for got, want in ((params, _weights(results, "checkpoints/reference/weight")),
                      (moments, _weights(results, "checkpoints/reference/moment"))):  # fmt: skip
        worst = max(max_relative_difference(got[n], w) for n, w in want.items())
        assert worst <= TOLERANCE["float64"], f"{saved}: saved tensors differ by {worst:.2e}"
    checkpoint = read(folder / "jax-sharded" / saved)
    assert (checkpoint.framework, checkpoint.plan, checkpoint.run) == ("jax", SAVED[saved], {"plan": saved})
    assert checkpoint.state.step == SAVED_AT and checkpoint.state.moments == {}
    np.testing.assert_allclose(checkpoint.state.losses, results["checkpoints/reference/losses"][:SAVED_AT],
                               rtol=TOLERANCE["float64"])  # fmt: skip


def test_a_save_killed_before_its_commit_is_never_read(runs):
    """The FSDP run resumed and killed while saving step 4 (its shards written, training.json and
    the rename not): ``step-00000004.partial`` holds Orbax's files, and the run's folder still reads
    as step 3, as every resumed run above read it; the partial folder itself is refused."""
    from transformer_run.sharded_checkpoint import committed_steps, read, step_folder
    from transformer_spec.checks import WeightsFileError

    _, folder = runs
    directory = folder / "jax-sharded" / KILLED
    partial = step_folder(directory, SAVED_AT + 1) + ".partial"
    assert os.path.isdir(os.path.join(partial, "state")), os.listdir(directory)
    assert committed_steps(directory) == [SAVED_AT]
    assert read(directory).state.step == SAVED_AT
    with pytest.raises(WeightsFileError):
        read(partial)


# ------------------------------------------------------------------------------ memory while saving
MEMORY_PROCESSES = 4  # of one CPU device each: under FSDP 4, a process is a rank holding a quarter


def save_memory(folder: str) -> None:
    """One of MEMORY_PROCESSES processes (``jax_impl.distributed.launch`` initialized it): MEMORY_CASE
    placed under FSDP 4 with Adam's moments, saved twice with Orbax (the first warms Orbax and
    TensorStore up), the second measured: this process's resident peak while saving above what it
    held before (Linux's high-water mark, reset before the save: every allocation, TensorStore's
    too), plus the bytes of its own shards. -> FOLDER/jax-save-memory-RANK.json."""
    import gc
    import json

    import jax
    from flax import nnx

    import jax_impl
    from jax_impl import sharded_checkpoint as jax_checkpoint
    from jax_impl import sharding
    from jax_impl.optim import Adam
    from transformer_spec import init_params

    from .cases import MEMORY_CASE

    plan = Plan(fsdp=4)
    params = init_params(MEMORY_CASE, seed=0, dtype="float32")
    one_device = 3 * sum(p.nbytes for p in params.values())  # weights, Adam's m and v
    model = jax_impl.build_model(MEMORY_CASE, params)
    mesh = sharding.sharding_mesh(plan)
    sharding.shard_model(model, mesh, plan)
    optimizer = Adam(model, lambda step: 1e-3)
    sharding.shard_optimizer(optimizer, mesh, plan)
    del params
    gc.collect()
    arrays = [leaf for leaf in jax.tree.leaves((nnx.state(model), nnx.state(optimizer.optimizer)))
              if isinstance(leaf, jax.Array)]  # fmt: skip
    own = sum(shard.data.nbytes for array in arrays for shard in array.addressable_shards)
    rank = jax.process_index()
    jax_checkpoint.save(f"{folder}/jax-save-memory-warm-up", model, optimizer)
    gc.collect()
    before = _resident("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the high-water mark back to what is resident now
    jax_checkpoint.save(f"{folder}/jax-save-memory", model, optimizer)
    extra = _resident("VmHWM") - before
    with open(f"{folder}/jax-save-memory-{rank}.json", "w") as out:
        json.dump({"own": own, "extra": extra, "one-device": one_device}, out)


def _resident(field: str) -> int:
    """Bytes of /proc/self/status's ``field`` (VmRSS: resident now; VmHWM: its peak)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def launch_save_memory(folder: str) -> int:
    from jax_impl import distributed

    return distributed.launch(save_memory, folder, processes=MEMORY_PROCESSES, cpu_devices=1, timeout=300)


@pytest.fixture(scope="module")
def save_memory_runs(sharded_runs):
    if not sharded_runs.available("jax-save-memory"):
        pytest.skip("jax is not installed")
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("the resident peak is read from Linux's /proc")
    run = sharded_runs["jax-save-memory"]
    run.check()
    import json

    return [json.loads((run.folder / f"jax-save-memory-{rank}.json").read_text()) for rank in range(MEMORY_PROCESSES)]


def test_saving_under_fsdp_4_holds_each_process_s_own_shards(save_memory_runs):
    """4 processes of one device, MEMORY_CASE (66 MB of float32 weights) under FSDP 4: each holds a
    quarter of the weights and moments, and the fullest one's peak while Orbax saves (its shards
    plus what the save allocates) is under 0.3 of one device's weights + moments."""
    fullest = max(run["own"] + run["extra"] for run in save_memory_runs)
    one_device = save_memory_runs[0]["one-device"]
    shares = [run["own"] / one_device for run in save_memory_runs]
    assert all(0.24 <= share <= 0.26 for share in shares), shares
    assert fullest / one_device <= 0.3, f"{fullest / one_device:.3f} of one device's weights + moments"


if __name__ == "__main__":  # processes.py: python -m shared_tests.sharding.test_jax_checkpoints FOLDER
    raise SystemExit(launch_save_memory(sys.argv[1]))
