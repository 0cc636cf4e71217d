"""torch's sharded step is the single-device step: FSDP (``fully_shard``), tensor parallel
(``parallelize_module``), FSDP x tensor parallel and data parallel x tensor parallel, over gloo
processes, on the Llama-style decoder and the paper's encoder-decoder, give one device's logits,
loss and gradients (float64, and float32 for the pairs of ``cases.FLOAT32``) and 20 float64 Adam
steps its weights; with dropout, 3 Adam steps from the same seed are torch's own single device's
(losses, weights, the generator's state); each step runs, by kind, the collectives NumPy's written-out step names, as many
and as large; FSDP over 4 processes holds under 0.3 of one device's weights, gradients and Adam
moments; a sharded run's checkpoint (whole tensors, canonical names) loads into every backend with
one device's weights and moments.

Two groups of processes, one after the other, started once per test run (processes.py starts
``python -m shared_tests.sharding.test_torch_sharding FOLDER``, ``launch``): 2 ranks for FSDP and
tensor parallel alone, then 4 for the 2-D meshes and FSDP over 4, one process per rank, meeting
through a file as torchrun's would. The launcher imports torch once and forks each rank from itself
(started on their own, the six ranks spent 5 s of CPU each importing torch and its distributed
packages; the groups took 170 s of CPU in all, forked 125 s). Each group's rank 0 writes
what it measured to an .npz for the tests to hold to one device: the reference's (NumPy's,
``cases.one_device``), which torch's own single device equals to ~1e-15 in the parity suite.
"""

from __future__ import annotations

import datetime
import functools
import json
import pathlib
import sys

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run.sharding import Plan

from .cases import (
    CONFIGS,
    DROPOUT_SEED,
    DROPOUT_STEPS,
    FLOAT32,
    MEMORY_CASE,
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
from .processes import run_group

GROUPS = {  # processes: {name: plan}
    2: {"fsdp": Plan(fsdp=2), "tp": Plan(tensor_parallel=2)},
    4: {"fsdp-x-tp": Plan(fsdp=2, tensor_parallel=2), "dp-x-tp": Plan(data_parallel=2, tensor_parallel=2),
        "fsdp-4": Plan(fsdp=4)},
}  # fmt: skip
PLANS = {name: plan for plans in GROUPS.values() for name, plan in plans.items()}
CHECKPOINTED = "fsdp-x-tp"  # the run whose checkpoint every backend loads
RANK_TIMEOUT = 300  # seconds a rank waits in a collective for the others


def dtypes_of(model_name: str, plan_name: str) -> tuple[str, ...]:
    """What a plan's logits, loss and gradients are computed in (none under FSDP over 4 processes,
    run for its collectives and memory)."""
    if plan_name == "fsdp-4":
        return ()
    return ("float64", "float32") if (model_name, plan_name) in FLOAT32 else ("float64",)


# ------------------------------------------------------------------------------ in each process
def child(processes: int, out: str, rank: int, init_file: str) -> None:
    """Rank ``rank`` of a group of ``processes`` (met through ``init_file``): every plan of
    GROUPS[processes] on both models; rank 0 writes the results to ``out``."""
    import torch
    import torch.distributed as dist

    import torch_impl
    from torch_impl.sharding import (
        sharded_logits,
        sharded_loss_and_grads,
        sharded_train,
        step_collectives,
        step_memory,
    )
    from transformer_run.checkpoint import save_checkpoint
    from transformer_spec import init_params

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=processes,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT))  # fmt: skip
    results = {}
    for plan_name, plan in GROUPS[processes].items():
        for model_name, config in CONFIGS.items():
            key, batch = f"{plan_name}/{model_name}", batch_of(config)
            for dtype in dtypes_of(model_name, plan_name):
                model = torch_impl.build_model(config, params_of(config, dtype))
                loss, grads = sharded_loss_and_grads(model, batch, plan)
                results[f"{key}/{dtype}/loss"] = loss
                results[f"{key}/{dtype}/logits"] = sharded_logits(model, batch, plan)
                results |= {f"{key}/{dtype}/grad/{n}": g for n, g in grads.items()}
            model = torch_impl.build_model(config, params_of(config, "float64"))
            counts = step_collectives(model, batch, plan)
            results[f"{key}/collectives"] = json.dumps(counts)
            if plan_name == "fsdp-4":
                continue
            config = adam_config(model_name)
            model = torch_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
            checkpoint = None
            if plan_name == CHECKPOINTED:
                path = f"{out}.{model_name}.safetensors"

                def checkpoint(state, path=path, model=model, config=config):
                    save_checkpoint(path, config, torch_impl.to_params(model), state, {"plan": CHECKPOINTED})

            losses = sharded_train(model, [batch], STEPS, schedule(config), plan=plan, checkpoint=checkpoint,
                                   checkpoint_every=STEPS)  # fmt: skip
            results[f"{key}/curve"] = np.array(losses)
            results |= {f"{key}/trained/{n}": w for n, w in torch_impl.to_params(model).items()}
            config, states = dropout_config(model_name), []  # with dropout, from another seed
            model = torch_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
            losses = sharded_train(model, [batch], DROPOUT_STEPS, schedule(config), seed=DROPOUT_SEED, plan=plan,
                                   checkpoint=states.append)  # fmt: skip
            results[f"{key}/dropout/losses"] = np.array(losses)
            results[f"{key}/dropout/streams"] = np.array(states[-1].dropout) if states else np.array("")
            results |= {f"{key}/dropout/weight/{n}": w for n, w in torch_impl.to_params(model).items()}
    if "fsdp-4" in GROUPS[processes]:  # the fullest rank's peak, measured by torch's FSDP tracker
        params = init_params(MEMORY_CASE, seed=0, dtype="float32")
        model = torch_impl.build_model(MEMORY_CASE, params)
        held = step_memory(model, batch_of(MEMORY_CASE), GROUPS[processes]["fsdp-4"])
        results |= {f"fsdp-4/memory/{kind}": size for kind, size in held.items()}
        results["fsdp-4/memory/one"] = 4 * sum(p.nbytes for p in params.values())  # weights, grads, m, v
    if rank == 0:
        np.savez(out, **results)
    dist.barrier()
    dist.destroy_process_group()


def launch(folder: str) -> None:
    """Each group of GROUPS in turn: its ranks forked from this process, which has imported what
    they run (copies of it: nothing is imported again), rank r of a group of n running
    ``child(n, FOLDER/group-n.npz, r, FOLDER/sharding-rendezvous-n)`` (``run_group``); exits with each failed
    rank's status."""
    import torch_impl.sharding  # noqa: F401  (and torch, torch.distributed): what every rank runs
    import transformer_run.checkpoint  # noqa: F401

    failed = []
    for size in GROUPS:
        out, rendezvous = f"{folder}/group-{size}.npz", f"{folder}/sharding-rendezvous-{size}"
        failed += run_group(child, [(size, out, rank, rendezvous) for rank in range(size)])
    if failed:
        sys.exit("\n".join(failed))


@pytest.fixture(scope="module")
def groups(sharded_runs):
    """The launcher (processes.py starts it once per test run, when a test first needs it)."""
    if not sharded_runs.available("torch"):
        pytest.skip("torch is not installed")
    return sharded_runs["torch"]


def results_of(groups, processes: int) -> dict[str, np.ndarray]:
    """Wait for the groups: what the group of ``processes``'s rank 0 wrote; the launcher's output
    (each failed rank's traceback) in the failure."""
    groups.check()
    return dict(np.load(groups.folder / f"group-{processes}.npz"))


# ------------------------------------------------------------------------------ the tests
# One test per group of processes (each group runs once, whichever xdist worker takes it); each
# checks every plan of its group on both models.
def test_fsdp_and_tensor_parallel_over_2_processes_equal_one_device(groups):
    results = results_of(groups, 2)
    for plan_name in GROUPS[2]:
        for model_name in CONFIGS:
            check_logits_loss_and_gradients(results, plan_name, model_name)
            check_twenty_adam_steps(results, plan_name, model_name)
            check_dropout(results, plan_name, model_name)
            check_collectives(results, plan_name, model_name)


def test_2d_meshes_and_fsdp_over_4_processes_equal_one_device(groups):
    """FSDP x tensor parallel and data parallel x tensor parallel as above; FSDP over 4 processes
    for the memory each holds; the FSDP x tensor parallel run's checkpoint in every backend."""
    results = results_of(groups, 4)
    for model_name in CONFIGS:
        for plan_name in ("fsdp-x-tp", "dp-x-tp"):
            check_logits_loss_and_gradients(results, plan_name, model_name)
            check_twenty_adam_steps(results, plan_name, model_name)
            check_dropout(results, plan_name, model_name)
        for plan_name in GROUPS[4]:
            check_collectives(results, plan_name, model_name)
        check_checkpoint(groups.folder / "group-4.npz", model_name)
    check_fsdp_memory(results)


def check_logits_loss_and_gradients(results, plan_name: str, model_name: str) -> None:
    """float64 within 1e-12 and float32 within 1e-5, per tensor, of the reference's single device
    (NumPy's, ``cases.one_device``)."""
    key = f"{plan_name}/{model_name}"
    for dtype in dtypes_of(model_name, plan_name):
        want_logits, want_loss, want = one_device(model_name, dtype)
        error = max_relative_difference(results[f"{key}/{dtype}/logits"], want_logits)
        assert error <= TOLERANCE[dtype], f"{key} {dtype}: logits differ by {error:.2e}"
        assert abs(float(results[f"{key}/{dtype}/loss"]) - want_loss) / want_loss <= TOLERANCE[dtype], key
        got = {name: results[f"{key}/{dtype}/grad/{name}"] for name in want}
        error = gradient_error(got, want, dtype)
        assert error <= TOLERANCE[dtype], f"{key} {dtype}: gradients differ by {error:.2e}"


def check_twenty_adam_steps(results, plan_name: str, model_name: str) -> None:
    """The loss of every step and each trained weight within 1e-12 (float64) of the reference's
    single device after the same steps (``cases.one_device_training``)."""
    key = f"{plan_name}/{model_name}"
    curve, want, _ = one_device_training(model_name)
    assert np.max(np.abs(results[f"{key}/curve"] - curve) / curve) <= TOLERANCE["float64"], key
    for name, weight in want.items():
        error = max_relative_difference(results[f"{key}/trained/{name}"], weight)
        assert error <= TOLERANCE["float64"], f"{key}: {name} differs by {error:.2e} after {STEPS} steps"


@functools.cache
def one_device_with_dropout(model_name: str) -> tuple[np.ndarray, dict[str, np.ndarray], str]:
    """torch's own single device (each framework's masks are its generator's) trained DROPOUT_STEPS
    Adam steps with dropout from DROPOUT_SEED: (each step's loss, the final weights, the dropout
    streams its checkpoint holds after the last step)."""
    import torch_impl
    from transformer_spec import init_params

    config, states = dropout_config(model_name), []
    model = torch_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = torch_impl.train(model, [batch_of(config)], DROPOUT_STEPS, schedule(config), seed=DROPOUT_SEED,
                              checkpoint=states.append)  # fmt: skip
    return np.array(losses), torch_impl.to_params(model), states[-1].dropout


def check_dropout(results, plan_name: str, model_name: str) -> None:
    """Dropout 0.1, 3 float64 Adam steps from seed 5, against torch's own single device: every
    step's loss to 1e-12, the weights per tensor within 1e-12 of its largest entry, and the
    checkpoint's dropout streams (torch's generator) exactly one device's: each rank draws the one
    device's mask of the whole activation and keeps its part (``WholeMaskDropout``: its rows, its
    heads or hidden features). The masks matter: without dropout the losses differ."""
    key = f"{plan_name}/{model_name}/dropout"
    want_losses, want, want_streams = one_device_with_dropout(model_name)
    np.testing.assert_allclose(results[f"{key}/losses"], want_losses, rtol=TOLERANCE["float64"], err_msg=key)
    for name, weight in want.items():
        error = max_relative_difference(results[f"{key}/weight/{name}"], weight)
        assert error <= TOLERANCE["float64"], f"{key}: {name} differs by {error:.2e} after {DROPOUT_STEPS} steps"
    assert str(results[f"{key}/streams"]) == want_streams, f"{key}: the checkpoint's dropout streams"
    without = one_device_training(model_name)[0][:DROPOUT_STEPS]
    assert np.max(np.abs(want_losses / without - 1)) > 1e-3


def check_collectives(results, plan_name: str, model_name: str) -> None:
    """By kind, counted at torch's dispatcher, against NumPy's step on the same plan, exactly, with
    their bytes: FSDP's all-gathers (each layer in the forward and again in the backward, the rest
    once) and reduce-scatters (one per unit); data parallel's all-reduces (one per unit); tensor
    parallel's all-reduces, Megatron's: one per block in the forward, and in the backward one per
    distinct input of a block (``BlockInput`` makes it one DTensor, which w_q, w_k and w_v all
    read, so their parts of its gradient are added before the one all-reduce)."""
    import numpy_impl
    from numpy_impl.sharding import step_collectives

    config, plan = CONFIGS[model_name], PLANS[plan_name]
    got = json.loads(str(results[f"{plan_name}/{model_name}/collectives"]))
    reference = step_collectives(numpy_impl.build_model(config, params_of(config, "float64")), batch_of(config), plan)
    assert got == reference, f"{plan_name}/{model_name}: torch runs {got}, NumPy's step {reference}"


def check_fsdp_memory(results) -> None:
    """FSDP over 4 processes, MEMORY_CASE (12 layers, 66 MB of float32 weights): what the fullest
    rank holds at the peak of a training step, measured by torch's ``FSDPMemTracker``, against one
    device's weights, gradients and Adam moments. Its weights (its quarter, and the layer gathered
    whole), gradients, moments and FSDP's communication buffers: under 0.3 (0.26 measured); with
    the activations and temporaries, 0.39."""
    from transformer_spec import param_schema

    held = {kind: int(results[f"fsdp-4/memory/{kind}"]) for kind in
            ("weights", "gradients", "adam", "communication", "activations", "other", "total", "one")}  # fmt: skip
    one = held["one"]
    state = held["weights"] + held["gradients"] + held["adam"] + held["communication"]
    assert one / 4 < state <= 0.3 * one, f"weights, gradients, Adam and buffers: {state / one:.3f} of one device"
    # the moments, a quarter of one device's two, and torch's Adam's step count for each weight
    assert one // 8 <= held["adam"] <= one // 8 + 8 * len(param_schema(MEMORY_CASE)), held
    assert held["total"] == sum(size for kind, size in held.items() if kind not in ("total", "one"))


def check_checkpoint(out: pathlib.Path, model_name: str) -> None:
    """Saved from the FSDP x tensor parallel run: whole tensors under the canonical names, equal to
    the reference's single device's weights and Adam moments after the same steps, and loaded by
    every backend."""
    import importlib

    from transformer_run.checkpoint import load_checkpoint

    saved = load_checkpoint(f"{out}.{model_name}.safetensors")
    _, want, moments = one_device_training(model_name)
    assert saved.state.step == STEPS and sorted(saved.params) == sorted(want)
    for name in want:
        error = max_relative_difference(saved.params[name], want[name])
        assert error <= TOLERANCE["float64"], f"checkpoint {model_name}: {name} differs by {error:.2e}"
    assert sorted(saved.state.moments) == sorted(moments)
    for name, moment in moments.items():
        error = max_relative_difference(saved.state.moments[name], moment)
        assert error <= TOLERANCE["float64"], f"checkpoint {model_name}: Adam's {name} differs by {error:.2e}"
    for backend in ("numpy", "torch", "jax"):
        if importlib.util.find_spec(backend) is None and backend != "numpy":
            continue
        impl = importlib.import_module(f"{backend}_impl")
        loaded = impl.to_params(impl.build_model(saved.config, saved.params))
        for name in want:
            assert np.array_equal(np.asarray(loaded[name]), saved.params[name]), f"{backend}: {name}"


if __name__ == "__main__":  # the launcher: python -m shared_tests.sharding.test_torch_sharding FOLDER
    launch(sys.argv[1])
