"""torch's sharded checkpoints, in its own format (``torch.distributed.checkpoint``: each rank writes
its own shards, no rank gathers the model) resume under another plan: saved at step 3 under FSDP 4,
tensor parallel 2 and FSDP 2 x tensor parallel 2, each resumed under those three and one device
(4 x 3 cells), the float64 losses of steps 4..6 and the final weights equal to the uninterrupted
run's (NumPy's one device: the sharded runs are held to it in test_torch_sharding.py). The
checkpoint consolidated into one file (``transformer_run.sharded_checkpoint.consolidate``) resumes
in NumPy under each plan, and NumPy's, consolidated, resumes in torch under each plan. While saving under FSDP 4, the twelve-layer model of the memory
tests, each rank holds its own shards: its peak (torch's tensors, tracked by torch's MemTracker, and
Python's allocations, by tracemalloc) is under 0.3 of one device's weights + moments.

One launch (processes.py starts ``python -m shared_tests.sharding.test_torch_checkpoints FOLDER``):
groups of ranks forked from the launcher (``run_group``) in the order the cells need: 2 ranks save
under tensor parallel 2; 4 ranks save under FSDP 4 and FSDP 2 x TP 2, resume all three under both,
and measure the save; 2 ranks resume the 4-rank saves under tensor parallel 2; 1 rank resumes all
three on one device. Each group's rank 0 writes an .npz.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import sys

import numpy as np
import pytest

from transformer_run import sharded_checkpoint
from transformer_run.sharding import Plan

from .cases import (
    MEMORY_CASE,
    RESUMED_STEPS,
    SAVE_AT,
    adam_config,
    assert_uninterrupted,
    batch_of,
    checkpoint_train,
    schedule,
    uninterrupted,
)
from .processes import run_group

MODEL = "llama"
SAVED = {"fsdp-4": Plan(fsdp=4), "tp-2": Plan(tensor_parallel=2), "fsdp-2-x-tp-2": Plan(fsdp=2, tensor_parallel=2)}
RESUMED = {"fsdp-4": Plan(fsdp=4), "tp-2": Plan(tensor_parallel=2), "fsdp-2-x-tp-2": Plan(fsdp=2, tensor_parallel=2),
           "one-device": Plan()}  # fmt: skip
GROUPS = [  # (ranks, the plans it saves under, the plans it resumes under)
    (2, ["tp-2"], []),
    (4, ["fsdp-4", "fsdp-2-x-tp-2"], ["fsdp-4", "fsdp-2-x-tp-2"]),
    (2, [], ["tp-2"]),
    (1, [], ["one-device"]),
]
RANK_TIMEOUT = 300


# ------------------------------------------------------------------------------ in each process
def child(group: int, folder: str, rank: int, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    import torch_impl
    from torch_impl.sharding import sharded_train
    from transformer_spec import init_params

    size, saves, resumes = GROUPS[group]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT))  # fmt: skip
    config = adam_config(MODEL)
    results = {}

    def train(plan, steps, **options):
        model = torch_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
        losses = sharded_train(model, [batch_of(config)], steps, schedule(config), plan=plan, **options)
        return np.array(losses), torch_impl.to_params(model)

    for name in saves:
        train(SAVED[name], SAVE_AT, checkpoint_dir=f"{folder}/saved-{name}", checkpoint_every=SAVE_AT)
    for resumed in resumes:
        for saved in SAVED:
            checkpoint = sharded_checkpoint.read(f"{folder}/saved-{saved}")
            losses, weights = train(RESUMED[resumed], RESUMED_STEPS, resume=checkpoint)
            results[f"{saved}/{resumed}/losses"] = losses
            results |= {f"{saved}/{resumed}/weight/{n}": w for n, w in weights.items()}
    # NumPy's checkpoint, consolidated into one file, resumed here under each plan this group resumes
    from transformer_run.checkpoint import load_checkpoint

    file = load_checkpoint(f"{folder}/numpy.safetensors")
    for name in resumes:
        model = torch_impl.build_model(file.config, file.params)
        losses = sharded_train(model, [batch_of(config)], RESUMED_STEPS, schedule(config), plan=RESUMED[name],
                               resume=file.state)  # fmt: skip
        results[f"numpy/{name}/losses"] = np.array(losses)
        results |= {f"numpy/{name}/weight/{n}": w for n, w in torch_impl.to_params(model).items()}
    if size == 4:
        results |= {f"memory/{k}": v for k, v in save_memory(folder, rank).items()}
    if rank == 0:
        np.savez(f"{folder}/group-{group}.npz", **results)
    dist.barrier()
    dist.destroy_process_group()


def save_memory(folder: str, rank: int) -> dict[str, int]:
    """The fullest rank's peak while it saves MEMORY_CASE under FSDP 4 (after one step: Adam's moments
    exist, the gradients are freed): torch's tensors alive (MemTracker, with the model and optimizer
    registered) plus Python's allocations (tracemalloc), and one device's weights + moments."""
    import tracemalloc

    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker  # torch's, not public

    import torch_impl
    from torch_impl import sharded_checkpoint as torch_checkpoint
    from torch_impl.optim import Adam
    from torch_impl.sharding import _setup, sharded_train_step
    from transformer_spec import init_params

    plan = Plan(fsdp=4)
    params = init_params(MEMORY_CASE, seed=0, dtype="float32")
    sharded, mesh = _setup(torch_impl.build_model(MEMORY_CASE, params), plan)
    optimizer = Adam(sharded, lambda t: 1e-3)
    sharded_train_step(sharded, optimizer, batch_of(MEMORY_CASE), 0.0, mesh=mesh)
    target = f"{folder}/memory"
    if rank == 0:
        os.makedirs(target, exist_ok=True)
    dist.barrier()
    tracker = MemTracker()
    tracker.track_external(sharded, optimizer.optimizer)
    tracemalloc.start()
    with tracker:
        torch_checkpoint.save(target, sharded, optimizer)
    _, python_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = tracker.get_tracker_snapshot("peak")
    tensors = max(sum(v for k, v in kinds.items() if getattr(k, "value", k) == "Total") for kinds in peak.values())
    totals = [torch.zeros((), dtype=torch.int64) for _ in range(4)]
    dist.all_gather(totals, torch.tensor(tensors + python_peak))
    return {"fullest": int(max(totals)), "one-device": 3 * sum(p.nbytes for p in params.values())}


def launch(folder: str) -> None:
    import torch_impl.sharding  # noqa: F401  (and torch, torch.distributed): what every rank runs


    # NumPy's reference saved under FSDP 4 and consolidated: the one file the 4 ranks resume
    checkpoint_train(Plan(fsdp=4), SAVE_AT, checkpoint_dir=f"{folder}/saved-numpy", checkpoint_every=SAVE_AT)
    sharded_checkpoint.consolidate(f"{folder}/saved-numpy", f"{folder}/numpy.safetensors")
    failed = []
    for group, (size, _, _) in enumerate(GROUPS):
        failed += run_group(child, [(group, folder, rank, f"{folder}/checkpoints-rendezvous-{group}") for rank in range(size)])
        if failed:
            break
    if failed:
        sys.exit("\n".join(failed))


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def groups(sharded_runs):
    if not sharded_runs.available("torch-checkpoints"):
        pytest.skip("torch is not installed")
    run = sharded_runs["torch-checkpoints"]
    uninterrupted()  # the reference, computed while they run
    run.check()
    results = {}
    for group in range(len(GROUPS)):
        results |= dict(np.load(run.folder / f"group-{group}.npz"))
    return run.folder, results


@pytest.fixture(scope="module")
def consolidated(groups, tmp_path_factory):
    """saved plan -> torch's checkpoint saved under it as one file (``consolidate``), made once for the
    tests that resume it."""
    folder, files = groups[0], {}

    def file_of(saved: str):
        if saved not in files:
            files[saved] = tmp_path_factory.mktemp(f"consolidated-{saved}") / "run.safetensors"
            sharded_checkpoint.consolidate(folder / f"saved-{saved}", files[saved])
        return files[saved]

    return file_of


def _resumed_as_never_stopped(results: dict[str, np.ndarray], key: str) -> None:
    prefix = f"{key}/weight/"
    weights = {k[len(prefix) :]: v for k, v in results.items() if k.startswith(prefix)}
    assert_uninterrupted(results[f"{key}/losses"], weights, key)


@pytest.mark.parametrize("resumed", list(RESUMED))
@pytest.mark.parametrize("saved", list(SAVED))
def test_torch_s_checkpoint_saved_under_one_plan_resumes_under_another(groups, saved, resumed):
    _, results = groups
    _resumed_as_never_stopped(results, f"{saved}/{resumed}")


@pytest.mark.parametrize("resumed", list(RESUMED))
@pytest.mark.parametrize("saved", list(SAVED))
def test_torch_s_checkpoint_consolidated_resumes_in_numpy(consolidated, saved, resumed):
    """Each of torch's checkpoints as one file, resumed by NumPy's reference under each plan."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train
    from transformer_run.checkpoint import load_checkpoint

    file = load_checkpoint(consolidated(saved))
    model = numpy_impl.build_model(file.config, file.params)
    losses = sharded_train(model, [batch_of(file.config)], RESUMED_STEPS, schedule(file.config),
                           plan=RESUMED[resumed], resume=file.state)  # fmt: skip
    assert_uninterrupted(np.array(losses), numpy_impl.to_params(model), "resumed in NumPy")


@pytest.mark.parametrize("saved", list(SAVED))
def test_torch_s_checkpoint_consolidated_resumes_in_jax(consolidated, saved):
    """Each of torch's checkpoints as one file, resumed by JAX on one device (``train`` with the
    file's state): the uninterrupted run. (JAX's sharded runs resume such a file under each plan in
    test_jax_checkpoints.py: NumPy's, consolidated.)"""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    import jax_impl
    from transformer_run.checkpoint import load_checkpoint

    file = load_checkpoint(consolidated(saved))
    model = jax_impl.build_model(file.config, file.params)
    losses = jax_impl.train(model, [batch_of(file.config)], RESUMED_STEPS, schedule(file.config), resume=file.state)
    assert_uninterrupted(np.array(losses), jax_impl.to_params(model), "resumed in JAX")


def test_torch_s_checkpoint_holds_each_rank_s_shards_and_consolidates(groups, tmp_path):
    """DCP's files (one per rank), training.json saying torch and the plan; consolidated into one
    file, resumed in NumPy under tensor parallel 2: the uninterrupted run."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train
    from transformer_run.checkpoint import load_checkpoint

    folder, _ = groups
    checkpoint = sharded_checkpoint.read(folder / "saved-fsdp-4")
    assert (checkpoint.framework, checkpoint.plan, checkpoint.state.step) == ("torch", Plan(fsdp=4), SAVE_AT)
    assert sorted(f for f in os.listdir(os.path.join(checkpoint.folder, "state")) if f.endswith(".distcp")) == [
        f"__{r}_0.distcp" for r in range(4)
    ]
    sharded_checkpoint.consolidate(checkpoint.folder, tmp_path / "run.safetensors")
    file = load_checkpoint(tmp_path / "run.safetensors")
    model = numpy_impl.build_model(file.config, file.params)
    losses = sharded_train(model, [batch_of(file.config)], RESUMED_STEPS, schedule(file.config), plan=Plan(tensor_parallel=2),
                           resume=file.state)  # fmt: skip
    assert_uninterrupted(np.array(losses), numpy_impl.to_params(model), "resumed in NumPy")


@pytest.mark.parametrize("resumed", list(RESUMED))
def test_numpy_s_checkpoint_consolidated_resumes_in_torch_under_a_plan(groups, resumed):
    """NumPy's run saved under FSDP 4, consolidated into one file, resumed by torch's ranks: each cuts
    its shards of the whole moments as its weights are cut (``distribute_tensor``)."""
    _, results = groups
    _resumed_as_never_stopped(results, f"numpy/{resumed}")


def test_saving_under_fsdp_4_holds_each_rank_s_own_shards(groups):
    """The fullest rank's peak while saving: its quarter of the weights and moments (0.25) and what
    DCP holds for a moment; under 0.3 of one device's weights + moments."""
    _, results = groups
    share = int(results["memory/fullest"]) / int(results["memory/one-device"])
    assert share <= 0.3, f"{share:.3f} of one device's weights + moments"


if __name__ == "__main__":  # the launcher: python -m shared_tests.sharding.test_torch_checkpoints FOLDER
    launch(sys.argv[1])
