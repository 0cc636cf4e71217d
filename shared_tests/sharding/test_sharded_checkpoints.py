"""Sharded checkpoints, the reference's (NumPy's simulated devices, in this process) and what every
framework's share: a run saved at step 3 under FSDP 4, tensor parallel 2 or FSDP 2 x tensor parallel
2 resumes under each of those, data parallel 2 and one device, and its float64 losses and weights
are the uninterrupted run's; a save killed half-way is never read; ``consolidate`` gives one file
with the run's whole weights and moments, which every backend resumes; saving under FSDP 4 holds
a device's own pieces plus one tensor's copy. torch's and JAX's own formats are held to the same
matrix in test_torch_checkpoints.py and test_jax_checkpoints.py."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE, max_relative_difference
from transformer_run import sharded_checkpoint
from transformer_run.checkpoint import load_checkpoint
from transformer_run.sharding import Plan
from transformer_spec import WeightsFileError, init_params
from transformer_spec.io import FORMAT, write_safetensors

from ..helpers import one_line_error
from .cases import (
    MEMORY_CASE,
    RESUMED_STEPS,
    SAVE_AT,
    adam_config,
    assert_uninterrupted,
    batch_of,
    checkpoint_train,
    schedule,
)

SAVED = {"fsdp-4": Plan(fsdp=4), "tp-2": Plan(tensor_parallel=2), "fsdp-2-x-tp-2": Plan(fsdp=2, tensor_parallel=2)}
RESUMED = SAVED | {"dp-2": Plan(data_parallel=2), "one-device": Plan()}
@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    """{plan name: the run's folder}: SAVE_AT steps under each plan of SAVED, checkpointed then."""
    folders = {}
    for name, plan in SAVED.items():
        folder = str(tmp_path_factory.mktemp(f"saved-{name}"))
        checkpoint_train(plan, SAVE_AT, checkpoint_dir=folder, checkpoint_every=SAVE_AT, run_record={"plan": name})
        folders[name] = folder
    return folders


@pytest.mark.parametrize("resumed", list(RESUMED))
@pytest.mark.parametrize("saved_under", list(SAVED))
def test_a_checkpoint_saved_under_one_plan_resumes_under_another(saved, saved_under, resumed):
    """Each device reads the pieces ITS plan gives it from the pieces the saving plan wrote: the
    continued curve (steps 4..6, after the 3 stored) and the final weights are the uninterrupted
    run's, in float64."""
    checkpoint = sharded_checkpoint.read(saved[saved_under])
    assert (checkpoint.framework, checkpoint.plan, checkpoint.state.step) == ("numpy", SAVED[saved_under], SAVE_AT)
    losses, weights = checkpoint_train(RESUMED[resumed], RESUMED_STEPS, resume=checkpoint)
    assert_uninterrupted(losses, weights, f"saved under {saved_under}, resumed under {resumed}")


def test_each_device_writes_its_own_pieces_and_nothing_whole(saved):
    """FSDP 4: four files, each a quarter of every weight and moment; nothing else holds a tensor."""
    folder = sharded_checkpoint.latest(saved["fsdp-4"])
    files = sorted(os.listdir(folder))
    assert files == [f"device-{r}.safetensors" for r in range(4)] + ["training.json"]
    config, sizes = adam_config("llama"), [os.path.getsize(os.path.join(folder, f)) for f in files[:4]]
    whole = 3 * sum(p.nbytes for p in init_params(config, seed=0, dtype="float64").values())
    assert all(0.24 * whole < size < 0.27 * whole for size in sizes), (sizes, whole)


def test_a_save_killed_half_way_is_never_read(saved, tmp_path):
    """A step's folder is committed by one rename once every device has written: a run killed while
    saving step 6 leaves step-00000006.partial, which ``read`` skips for the last committed step;
    a folder with no committed step is refused in one line naming what it found."""
    folder = tmp_path / "run"
    folder.mkdir()
    os.rename(sharded_checkpoint.latest(saved["fsdp-4"]), folder / "step-00000003")  # a copy of ours
    half = folder / "step-00000006.partial"
    half.mkdir()
    (half / "device-0.safetensors").write_bytes(b"\0" * 100)  # what a killed save leaves
    assert sharded_checkpoint.read(folder).state.step == SAVE_AT
    os.rename(folder / "step-00000003", sharded_checkpoint.step_folder(saved["fsdp-4"], SAVE_AT))  # back
    with pytest.raises(WeightsFileError, match=r"no committed sharded checkpoint \(only \['step-00000006.partial'\]"):
        sharded_checkpoint.read(folder)


def test_a_later_step_replaces_all_but_the_newest_two(tmp_path):
    """Every 2 steps of 6: steps 4 and 6 stay, the older are removed once a newer one is committed."""
    checkpoint_train(Plan(fsdp=2), RESUMED_STEPS, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    assert sharded_checkpoint.committed_steps(tmp_path) == [4, 6]
    assert not [e for e in os.listdir(tmp_path) if not e.startswith("step-") or e.endswith(".partial")]


@pytest.mark.parametrize("saved_under", list(SAVED))
def test_consolidate_writes_the_whole_run_into_one_file_every_backend_resumes(saved, saved_under, tmp_path):
    """One file: the whole weights and Adam's moments of step 3 (the uninterrupted run's, which a
    one-device run's own checkpoint holds), the step, the losses; NumPy resumes it under another
    plan and on one device with the uninterrupted curve (torch and JAX resume it in their tests)."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train

    path = tmp_path / "run.safetensors"
    sharded_checkpoint.consolidate(saved[saved_under], path)
    file = load_checkpoint(path)
    states = []
    _, want = checkpoint_train(Plan(), SAVE_AT, checkpoint=states.append, checkpoint_every=SAVE_AT)
    assert file.state.step == SAVE_AT and file.run["framework"] == "numpy"
    for got, expected in ((file.params, want), (file.state.moments, states[-1].moments)):
        assert sorted(got) == sorted(expected)
        worst = max(max_relative_difference(got[n], w) for n, w in expected.items())
        assert worst <= TOLERANCE["float64"], f"consolidated from {saved_under}: {worst:.2e}"
    for plan in (Plan(tensor_parallel=2), Plan()):
        model = numpy_impl.build_model(file.config, file.params)
        losses = sharded_train(model, [batch_of(file.config)], RESUMED_STEPS, schedule(file.config), plan=plan,
                               resume=file.state)  # fmt: skip
        assert_uninterrupted(np.array(losses), numpy_impl.to_params(model), f"consolidated from {saved_under}, under {plan}")


def test_saving_under_fsdp_4_holds_a_device_s_pieces_and_one_tensor(tmp_path):
    """The twelve-layer model of the memory tests, under FSDP 4: while a device writes its file, it
    holds its pieces of the weights and of Adam's moments and the file's header (about 1.3 kB of
    bookkeeping per tensor: each tensor is written from its own memory, no copy), measured by
    tracemalloc around the save (NumPy's allocations are traced); under 0.3 of one device's weights
    + moments. (Writing each tensor through ``tobytes`` held one more copy of the largest piece.)"""
    import numpy_impl
    from numpy_impl import sharded_checkpoint as numpy_checkpoint
    from numpy_impl.sharding import ShardedRun

    params = init_params(MEMORY_CASE, seed=0, dtype="float32")
    run = ShardedRun(numpy_impl.build_model(MEMORY_CASE, params), Plan(fsdp=4))
    one_device = 3 * sum(p.nbytes for p in params.values())  # weights, m, v
    for rank, f, t in numpy_checkpoint.writers(run.plan):
        device = run.replicas[f].devices[t]
        held = sum(a.nbytes for a in numpy_checkpoint.device_tensors(device).values())
        tracemalloc.start()
        tracemalloc.reset_peak()
        write_safetensors(os.path.join(tmp_path, f"device-{rank}.safetensors"), numpy_checkpoint.device_tensors(device),
                          {"format": FORMAT})  # fmt: skip
        _, extra = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        tensors = len(numpy_checkpoint.device_tensors(device))
        assert extra <= 2048 * tensors, f"device {rank}: the save held {extra} bytes more ({tensors} tensors)"
        assert (held + extra) / one_device <= 0.3, f"device {rank}: {(held + extra) / one_device:.3f}"


def test_the_command_line_saves_resumes_under_another_plan_and_consolidates(tmp_path, monkeypatch, capsys):
    """transformer-ref train --fsdp 2 --tensor-parallel 2 --save DIR, then --resume DIR under tensor
    parallel 2, then consolidate, then --resume FILE on one device: the loss of the last step is the
    uninterrupted run's, printed to 4 places; a bad folder is one line and exit status 2. The
    commands run in this process (``transformer_cli.main``, what the command runs; NumPy's simulated
    devices start no process)."""
    from transformer_cli.main import main

    monkeypatch.chdir(tmp_path)
    base = ["train", "--task", "next-word", "--heads", "4", "--d-ff", "48", "--dtype", "float64"]

    def last_loss(*options):
        assert main([*base, *options]) == 0
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss:")][-1]

    last_loss("--fsdp", "2", "--tensor-parallel", "2", "--steps", "10", "--save", "run")
    last_loss("--resume", "run", "--tensor-parallel", "2", "--steps", "20")
    assert main(["checkpoint", "consolidate", "run", "run.safetensors"]) == 0
    resumed = last_loss("--resume", "run.safetensors", "--steps", "30", "--save", "one.safetensors")
    assert resumed.split(", last ")[1] == last_loss("--steps", "30").split(", last ")[1]
    one_line_error(capsys, ["checkpoint", "consolidate", ".", "x.safetensors"], "holds no committed sharded checkpoint")
