"""torch's sharded step across nodes is the single-device step: two torchrun invocations, one per
simulated node, each starting 2 ranks (``--nnodes 2 --nproc-per-node 2``, meeting through torchrun's
c10d rendezvous at one endpoint), run FSDP 4, data parallel 2 x tensor parallel 2 and FSDP 2 x
tensor parallel 2 on one 4-rank ``(data, model)`` mesh over gloo, and give one device's loss,
gradients and 20 float64 Adam steps on the Llama-style decoder; all four ranks get the same numbers,
bit for bit. A checkpoint (taken at step 10 and after the last) receives, on global rank 0, whole
weights and Adam moments, and the steps after one go on unchanged.

One launch runs every plan in turn: processes.py starts both nodes, ``python -m
torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint
localhost:PORT ... -m shared_tests.sharding.test_torch_nodes FOLDER`` (``torch_nodes``); each rank
finds its place in what torchrun sets (RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT), and each call of torch_impl.sharding makes its process group from them and ends it, as
under ``transformer-ref train`` run by torchrun: six groups, one after the other, in every rank. The
ranks write what they computed to FOLDER/torch-nodes-RANK.npz; the tests compare the files with the
reference's single device (NumPy's, computed here while the ranks run: ``cases.one_device``). About
35 s on the 2-core CPU, most of it the six processes (two torchruns, four ranks) importing torch.
"""

from __future__ import annotations

import os
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
from .parent import die_with_parent
from .processes import TORCH_NODES, TORCH_RANKS

NODES, RANKS = TORCH_NODES, TORCH_RANKS  # 2 nodes of 2 ranks (processes.py starts them): a mesh of 4
MODEL = "llama"  # the decoder of the other sharding tests; every plan below divides its weights
PLANS = {
    "fsdp-4": Plan(fsdp=4),  # every weight split over both nodes' ranks
    "dp-x-tp": Plan(data_parallel=2, tensor_parallel=2),  # tensor parallel inside each node
    "fsdp-x-tp": Plan(fsdp=2, tensor_parallel=2),
}
CHECKPOINT_EVERY = 10  # steps: the weights and moments made whole, read, and split again
PLACE = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")  # what torchrun sets


# ------------------------------------------------------------------------------ in each rank
def run_plans(folder: str) -> None:
    """One rank, started by torchrun: each plan's loss and gradients, then STEPS Adam steps,
    checkpointed every CHECKPOINT_EVERY; written to FOLDER/torch-nodes-RANK.npz."""
    die_with_parent()  # with its node's torchrun (its ranks run in sessions of their own)
    import torch

    import torch_impl
    from torch_impl import sharding

    torch.set_num_threads(1)
    place = {name: int(os.environ[name]) for name in PLACE}
    assert (place["WORLD_SIZE"], place["LOCAL_WORLD_SIZE"]) == (NODES * RANKS, RANKS), place
    config, results = CONFIGS[MODEL], {f"place/{name}": value for name, value in place.items()}
    for name, plan in PLANS.items():
        model = torch_impl.build_model(config, params_of(config, "float64"))
        loss, grads = sharding.sharded_loss_and_grads(model, batch_of(config), plan)
        results[f"{name}/loss"] = loss
        results |= {f"{name}/grad/{n}": g for n, g in grads.items()}
        trained = adam_config(MODEL)
        model = torch_impl.build_model(trained, init_params(trained, seed=0, dtype="float64"))

        steps = []  # those a checkpoint was taken after (global rank 0 alone takes them)

        def checkpoint(state, model=model, name=name, steps=steps, results=results):
            steps.append(state.step)
            results.update({f"{name}/checkpoint/{n}": w for n, w in torch_impl.to_params(model).items()})
            results.update({f"{name}/checkpoint/{n}": m for n, m in state.moments.items()})

        results[f"{name}/losses"] = sharding.sharded_train(
            model, [batch_of(trained)], STEPS, schedule(trained), plan=plan, checkpoint=checkpoint,
            checkpoint_every=CHECKPOINT_EVERY,
        )  # fmt: skip
        results[f"{name}/checkpoint-steps"] = steps
        results |= {f"{name}/weight/{n}": w for n, w in torch_impl.to_params(model).items()}
    np.savez(f"{folder}/torch-nodes-{place['RANK']}.npz", **results)


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def ranks(sharded_runs):
    """Each rank's results (processes.py starts both nodes once per test run)."""
    if not sharded_runs.available("torch-nodes"):
        pytest.skip("torch is not installed")
    run = sharded_runs["torch-nodes"]
    one_device(MODEL, "float64")  # the reference, computed while they run (cached for the tests)
    one_device_training(MODEL)
    run.check()
    return [dict(np.load(run.folder / f"torch-nodes-{rank}.npz")) for rank in range(NODES * RANKS)]


def test_the_ranks_span_two_nodes_and_compute_the_same_numbers(ranks):
    """Two ranks on each node, global rank = node * 2 + local rank (torchrun's numbering); every
    result of ranks 1 to 3 is rank 0's, bit for bit (one program on one mesh). The checkpoints
    reach global rank 0 alone (the one that writes them), after the others have gathered them too."""
    places = [{name: int(results[f"place/{name}"]) for name in PLACE} for results in ranks]
    assert sorted((p["GROUP_RANK"], p["LOCAL_RANK"]) for p in places) == [
        (node, rank) for node in range(NODES) for rank in range(RANKS)
    ], places
    assert all(p["RANK"] == p["GROUP_RANK"] * RANKS + p["LOCAL_RANK"] for p in places), places

    def numbers(results):  # what every rank computes: all but its place and rank 0's checkpoints
        return sorted(key for key in results if not key.startswith("place/") and "/checkpoint" not in key)

    first = ranks[0]
    assert len(numbers(first)) > len(PLANS) * 2 * len(one_device(MODEL, "float64")[2])
    for rank, results in enumerate(ranks[1:], start=1):
        assert numbers(results) == numbers(first), f"rank {rank} computed other things than rank 0"
        different = [key for key in numbers(first) if not np.array_equal(first[key], results[key])]
        assert not different, f"rank {rank} differs from rank 0 in {different[:5]}"
        assert all(len(results[f"{name}/checkpoint-steps"]) == 0 for name in PLANS), f"rank {rank} checkpointed"


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_each_plan_across_nodes_gives_the_single_device_loss_and_gradients(ranks, plan_name):
    """Against one device of the reference: within 1e-12 in float64."""
    results = ranks[0]
    _, want_loss, want_grads = one_device(MODEL, "float64")
    loss = float(results[f"{plan_name}/loss"])
    assert abs(loss - want_loss) / want_loss <= TOLERANCE["float64"], f"{plan_name}: {loss} vs {want_loss}"
    grads = {name: results[f"{plan_name}/grad/{name}"] for name in want_grads}
    error = gradient_error(grads, want_grads, "float64")
    assert error <= TOLERANCE["float64"], f"{plan_name}: gradients differ by {error:.2e}"


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_twenty_adam_steps_across_nodes_give_the_single_device_losses_and_weights(ranks, plan_name):
    """Each loss, and every tensor after STEPS steps to 1e-12 of its largest entry: the weights
    left whole in the model, and the weights and Adam's moments the last checkpoint received (whole
    tensors under the canonical names). The steps after the checkpoint at step 10 (the weights and
    moments made whole on every rank to be read) are the reference's."""
    results = ranks[0]
    want_losses, want_weights, want_moments = one_device_training(MODEL)
    key = plan_name
    np.testing.assert_allclose(results[f"{key}/losses"], want_losses, rtol=TOLERANCE["float64"], err_msg=key)
    assert list(results[f"{key}/checkpoint-steps"]) == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
    for what, want in (("weight", want_weights), ("checkpoint", want_weights), ("checkpoint", want_moments)):
        got = {n: results[f"{key}/{what}/{n}"] for n in want}
        assert {n: g.shape for n, g in got.items()} == {n: w.shape for n, w in want.items()}, f"{key}: {what}"
        worst = max(max_relative_difference(got[n], w) for n, w in want.items())
        assert worst <= TOLERANCE["float64"], f"{key}: {what} after {STEPS} Adam steps differs by {worst:.2e}"


if __name__ == "__main__":  # each rank: torchrun ... -m shared_tests.sharding.test_torch_nodes FOLDER
    run_plans(sys.argv[1])
