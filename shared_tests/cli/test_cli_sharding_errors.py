"""A sharding plan the model cannot split is one line and exit status 2 in every backend, before
anything runs: the plan is checked against every weight's pieces, tensor parallel's cut first and
FSDP's of the part it left (d_ff 42 halves, but its half, 21, does not)."""

from __future__ import annotations

import pytest

from ..helpers import needs, one_line_error


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_fsdp_that_cannot_split_a_tensor_parallel_part_is_one_line_and_status_2(capsys, monkeypatch, backend):
    needs(backend)
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not under torchrun: the plan's own devices
    argv = ["train", "--task", "copy", "--heads", "6", "--d-ff", "42", "--fsdp", "2", "--tensor-parallel", "2",
            "--backend", backend]  # fmt: skip
    one_line_error(capsys, argv, "--fsdp 2 --tensor-parallel 2", "fsdp 2 does not divide 21",
                   "ffn.w_1.bias (42,)", "after tensor_parallel 2 cut it to (21,)")  # fmt: skip


def test_sharded_checkpoint_mistakes_are_one_line_and_status_2(capsys, monkeypatch, tmp_path):
    """A sharded run's --save folder holding another run's checkpoints; a sharded checkpoint resumed
    in another framework (its files are its framework's: consolidate first); --max-restarts where
    this command restarts nothing; consolidate of a folder with nothing committed, or to a folder."""
    from transformer_cli.main import main

    for variable in ("WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TRANSFORMER_REF_RESTART_COUNT"):
        monkeypatch.delenv(variable, raising=False)
    run = str(tmp_path / "run")
    plan = ["--task", "next-word", "--heads", "4", "--d-ff", "48", "--fsdp", "2", "--steps", "2"]
    assert main(["train", *plan, "--save", run]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["train", *plan, "--save", run], f"--save {run} holds a run's checkpoints",
                   "the newest at step 2", f"--resume {run} continues it")  # fmt: skip
    one_line_error(capsys, ["train", "--resume", run, "--backend", "torch", "--steps", "3"], "--backend torch",
                   "holds numpy's own files", f"transformer-ref checkpoint consolidate {run} FILE")  # fmt: skip
    one_line_error(capsys, ["train", *plan, "--backend", "torch", "--max-restarts", "1", "--save", str(tmp_path / "t")],
                   "--max-restarts 1", "torchrun --max-restarts 1")  # fmt: skip
    one_line_error(capsys, ["train", *plan[:-4], "--max-restarts", "1"], "--max-restarts 1", "give --fsdp")
    one_line_error(capsys, ["checkpoint", "consolidate", str(tmp_path), "x.safetensors"],
                   "holds no committed sharded checkpoint")  # fmt: skip
    one_line_error(capsys, ["checkpoint", "consolidate", run, str(tmp_path)], "is a folder")
    one_line_error(capsys, ["checkpoint", "consolidate", run, str(tmp_path / "no" / "x.safetensors")],
                   "does not exist")  # fmt: skip
