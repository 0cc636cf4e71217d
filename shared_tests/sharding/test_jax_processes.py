"""JAX's sharded step across processes is the single-device step: 2 processes of 2 CPU devices each,
``jax.distributed``-initialized, run FSDP 4, data parallel 2 x tensor parallel 2 and FSDP 2 x
tensor parallel 2 on one 4-device mesh (the collectives cross the processes through gloo), and give
one device's loss, gradients and 20 float64 Adam steps on the Llama-style decoder; both processes
get the same numbers, bit for bit. A checkpoint (taken at step 10 and after the last) receives whole
weights and Adam moments, and the steps after one go on unchanged. FSDP 4's run also saves sharded
checkpoints (Orbax: each process writes its own shards), and the one at step 10 resumes under data
parallel 2 x tensor parallel 2 in the same processes with the reference's losses and weights.

One launch runs every plan in turn: processes.py starts ``python -m
shared_tests.sharding.test_jax_processes FOLDER``, which spawns the two processes with
``jax_impl.distributed.launch`` (the launcher of ``transformer-ref train --processes N``); each
finds its place in the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID,
what a scheduler sets for a process started by hand) and writes what it computed to
FOLDER/jax-processes-RANK.npz. The tests compare both files with the reference's single device
(NumPy's, computed here while the processes run: ``cases.one_device``).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run.sharding import Plan
from transformer_spec import init_params

from .cases import (
    CONFIGS,
    STEPS,
    adam_config,
    batch_of,
    gradient_error,
    one_device,
    one_device_training,
    params_of,
    schedule,
)

PROCESSES, DEVICES = 2, 2  # devices per process: a mesh of 4 across the two
MODEL = "llama"  # the decoder of the other sharding tests; every plan below divides its weights
PLANS = {
    "fsdp-4": Plan(fsdp=4),  # every weight split over both processes' devices
    "dp-x-tp": Plan(data_parallel=2, tensor_parallel=2),  # tensor parallel inside each process
    "fsdp-x-tp": Plan(fsdp=2, tensor_parallel=2),
}
CHECKPOINT_EVERY = 10  # steps: the weights and moments made whole, read, and split again
SHARDED = "jax-processes-sharded"  # the sharded checkpoints' folder (a run's: step-10, step-20)
SHARDED_PLANS = ("fsdp-4", "dp-x-tp")  # saved under the first (beside its whole checkpoints), resumed under the second


# ------------------------------------------------------------------------------ the processes
def run_plans(folder: str) -> None:
    """One process of the run (``initialize``d already): each plan's loss and gradients, then
    STEPS Adam steps, checkpointed every CHECKPOINT_EVERY; written to FOLDER/jax-processes-RANK.npz."""
    # imported before this process ran anything of its own only if the launcher forked it from its
    # fork server, which imports the launch's modules once (nothing here or in initialize imports it)
    preloaded = "jax_impl.sharded_checkpoint" in sys.modules
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax_impl
    from jax_impl import sharding

    assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (PROCESSES, DEVICES, 4)
    config, results = CONFIGS[MODEL], {}
    for name, plan in PLANS.items():
        model = jax_impl.build_model(config, params_of(config, "float64"))
        loss, grads = sharding.sharded_loss_and_grads(model, batch_of(config), plan)
        results[f"{name}/loss"] = loss
        results |= {f"{name}/grad/{n}": g for n, g in grads.items()}
        trained = adam_config(MODEL)
        model = jax_impl.build_model(trained, init_params(trained, seed=0, dtype="float64"))

        steps = []  # those a checkpoint was taken after; the last one's weights and moments kept

        def checkpoint(state, model=model, name=name, steps=steps, results=results):
            steps.append(state.step)
            results.update({f"{name}/checkpoint/{n}": w for n, w in jax_impl.to_params(model).items()})
            results.update({f"{name}/checkpoint/{n}": m for n, m in state.moments.items()})

        results[f"{name}/losses"] = sharding.sharded_train(
            model, [batch_of(trained)], STEPS, schedule(trained), plan=plan, checkpoint=checkpoint,
            checkpoint_every=CHECKPOINT_EVERY, run_record={"plan": name},
            checkpoint_dir=f"{folder}/{SHARDED}" if name == SHARDED_PLANS[0] else None,
        )  # fmt: skip
        results[f"{name}/checkpoint-steps"] = steps
        results |= {f"{name}/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
    results |= resumed_across_processes(folder)
    results["preloaded"] = np.array(preloaded)
    np.savez(f"{folder}/jax-processes-{jax.process_index()}.npz", **results)


def resumed_across_processes(folder: str) -> dict[str, np.ndarray]:
    """The sharded checkpoint the FSDP 4 run saved at step CHECKPOINT_EVERY (each process its
    shards, with Orbax), resumed under data parallel 2 x tensor parallel 2 to STEPS; and the whole
    tensors of its last one (step STEPS), read back in this process by ``whole_tensors``."""
    import jax_impl
    from jax_impl import sharded_checkpoint, sharding
    from transformer_run import sharded_checkpoint as folders

    saved, resumed = SHARDED_PLANS
    trained, directory = adam_config(MODEL), f"{folder}/{SHARDED}"
    checkpoint = folders.read(folders.step_folder(directory, CHECKPOINT_EVERY))
    assert checkpoint.plan == PLANS[saved] and checkpoint.run == {"plan": saved}
    model = jax_impl.build_model(trained, init_params(trained, seed=1, dtype="float64"))  # overwritten
    results = {"sharded/losses": np.array(sharding.sharded_train(
        model, [batch_of(trained)], STEPS, schedule(trained), plan=PLANS[resumed], resume=checkpoint
    ))}  # fmt: skip
    results |= {f"sharded/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
    params, moments = sharded_checkpoint.whole_tensors(folders.step_folder(directory, STEPS))
    results |= {f"sharded/whole/{n}": w for n, w in (params | moments).items()}
    return results


def launch(folder: str) -> int:
    from jax_impl import distributed

    return distributed.launch(run_plans, folder, processes=PROCESSES, cpu_devices=DEVICES, timeout=540)


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def processes(sharded_runs):
    """Each process's results (processes.py starts the launch once per test run)."""
    if not sharded_runs.available("jax-processes"):
        pytest.skip("jax is not installed")
    run = sharded_runs["jax-processes"]
    one_device(MODEL, "float64")  # the reference, computed while they run (cached for the tests)
    one_device_training(MODEL)
    run.check()
    return [dict(np.load(run.folder / f"jax-processes-{rank}.npz")) for rank in range(PROCESSES)]


def test_every_process_computes_the_same_numbers(processes):
    """Every result of process 1 is process 0's, bit for bit: one program, run on one mesh."""
    first, second = processes
    assert sorted(first) == sorted(second)
    different = [key for key in first if not np.array_equal(first[key], second[key])]
    assert not different, f"the processes differ in {different[:5]}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere the processes start afresh")
def test_the_processes_are_forked_from_a_server_that_imported_jax_once(processes):
    """On Linux ``launch`` forks each process from one server process that has imported JAX and the
    launch's modules (a fresh interpreter spends seconds importing them, each process and each
    restart again): the processes find the checkpoint module imported before they import anything."""
    assert [bool(results["preloaded"]) for results in processes] == [True] * PROCESSES


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_each_plan_across_processes_gives_the_single_device_loss_and_gradients(processes, plan_name):
    """Against one device of the reference: within 1e-12 in float64."""
    results = processes[0]
    _, want_loss, want_grads = one_device(MODEL, "float64")
    loss = float(results[f"{plan_name}/loss"])
    assert abs(loss - want_loss) / want_loss <= TOLERANCE["float64"], f"{plan_name}: {loss} vs {want_loss}"
    grads = {name: results[f"{plan_name}/grad/{name}"] for name in want_grads}
    error = gradient_error(grads, want_grads, "float64")
    assert error <= TOLERANCE["float64"], f"{plan_name}: gradients differ by {error:.2e}"


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_twenty_adam_steps_across_processes_give_the_single_device_losses_and_weights(processes, plan_name):
    """Each loss, and every tensor after STEPS steps to 1e-12 of its largest entry: the weights
    left whole in the model, and the weights and Adam's moments the last checkpoint received (whole
    tensors under the canonical names). The steps after the checkpoint at step 10 (the weights and
    moments made whole on every device to be read, then split again) are the reference's."""
    results = processes[0]
    want_losses, want_weights, want_moments = one_device_training(MODEL)
    key = plan_name
    np.testing.assert_allclose(results[f"{key}/losses"], want_losses, rtol=TOLERANCE["float64"], err_msg=key)
    assert list(results[f"{key}/checkpoint-steps"]) == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
    for what, want in (("weight", want_weights), ("checkpoint", want_weights), ("checkpoint", want_moments)):
        got = {n: results[f"{key}/{what}/{n}"] for n in want}
        assert {n: g.shape for n, g in got.items()} == {n: w.shape for n, w in want.items()}, f"{key}: {what}"
        worst = max(max_relative_difference(got[n], w) for n, w in want.items())
        assert worst <= TOLERANCE["float64"], f"{key}: {what} after {STEPS} Adam steps differs by {worst:.2e}"


def test_a_sharded_checkpoint_saved_across_processes_resumes_there_under_another_plan(processes, sharded_runs):
    """FSDP 4's sharded checkpoint at step 10 (each process wrote its own devices' shards: its own
    Orbax files), resumed under data parallel 2 x tensor parallel 2 on the same two processes: the
    reference's losses and weights after STEPS steps, within 1e-12; the last checkpoint's tensors,
    read whole by ``whole_tensors``, are those the whole checkpoint received at that step, exactly."""
    import pathlib

    from transformer_run.sharded_checkpoint import committed_steps, step_folder

    results = processes[0]
    want_losses, want_weights, want_moments = one_device_training(MODEL)
    np.testing.assert_allclose(results["sharded/losses"], want_losses, rtol=TOLERANCE["float64"])
    worst = max(max_relative_difference(results[f"sharded/weight/{n}"], w) for n, w in want_weights.items())
    assert worst <= TOLERANCE["float64"], f"resumed: weights after {STEPS} Adam steps differ by {worst:.2e}"
    for name in [*want_weights, *want_moments]:
        assert np.array_equal(results[f"sharded/whole/{name}"], results[f"{SHARDED_PLANS[0]}/checkpoint/{name}"]), name
    directory = sharded_runs["jax-processes"].folder / SHARDED
    assert committed_steps(directory) == [CHECKPOINT_EVERY, STEPS]
    folder = pathlib.Path(step_folder(directory, STEPS))
    assert all((folder / "state" / f"ocdbt.process_{rank}").is_dir() for rank in range(PROCESSES))


if __name__ == "__main__":  # the launcher: python -m shared_tests.sharding.test_jax_processes FOLDER
    raise SystemExit(launch(sys.argv[1]))
