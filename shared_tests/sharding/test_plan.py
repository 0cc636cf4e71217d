"""The sharding plan: which weight each strategy splits, and the plans that cannot work, refused before
anything starts with one line naming both numbers (``ValueError``; the command line's exit status 2)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_run.sharding import COLUMN, ROW, Plan, check_plan, fsdp_units, join, piece, placement, plan_for_devices
from transformer_spec import Config, init_params, param_schema

from ..helpers import needs, one_line_error

# Sizes every tested degree divides, still unequal to each other (a transposed split cannot hide).
LLAMA = Config.preset("tiny-llama").replace(d_model=72, num_heads=6, num_kv_heads=2, d_ff=36, tgt_vocab_size=64)
PAPER = Config.preset("tiny").replace(num_heads=4, d_ff=44, src_vocab_size=48, tgt_vocab_size=40)


@pytest.mark.parametrize(
    ("config", "plan", "rows", "devices", "words"),
    [
        (LLAMA, Plan(tensor_parallel=4), None, None, ("tensor_parallel 4", "num_heads 6")),
        (LLAMA, Plan(tensor_parallel=3), None, None, ("tensor_parallel 3", "num_kv_heads 2")),
        (LLAMA.replace(d_ff=37), Plan(tensor_parallel=2), None, None, ("tensor_parallel 2", "d_ff 37")),
        (LLAMA.replace(tgt_vocab_size=61), Plan(fsdp=2), None, None, ("fsdp 2", "61", "vocabulary")),
        (PAPER.replace(d_ff=37), Plan(fsdp=2), None, None, ("fsdp 2", "37", "w_1.bias")),
        (LLAMA, Plan(fsdp=2, tensor_parallel=2), 5, None, ("5 rows", "2 data devices")),
        (LLAMA, Plan(data_parallel=4), 2, None, ("2 rows", "4 data devices")),
        (LLAMA, Plan(fsdp=2, tensor_parallel=2), 8, 8, ("= 4 devices", "8 are there")),
    ],
)
def test_a_plan_that_cannot_work_is_refused_in_one_line_naming_both_numbers(config, plan, rows, devices, words):
    with pytest.raises(ValueError) as error:
        check_plan(config, plan, rows, devices)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{message!r} does not name {word!r}"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Plan(data_parallel=2, fsdp=2), ("data_parallel 2", "fsdp 2")),
        (lambda: Plan(tensor_parallel=0), ("tensor_parallel", "0")),
        (lambda: plan_for_devices(8, fsdp=3), ("fsdp 3", "8 devices")),
    ],
)
def test_degrees_that_cannot_make_a_mesh_are_refused(make, words):
    with pytest.raises(ValueError) as error:
        make()
    for word in words:
        assert word in str(error.value)


def test_a_plan_for_a_world_of_devices_gives_the_rest_to_data_parallel():
    assert plan_for_devices(8, fsdp=1, tensor_parallel=2) == Plan(data_parallel=4, tensor_parallel=2)
    assert plan_for_devices(6, fsdp=2, tensor_parallel=3).devices == 6


def test_megatron_splits_the_block_openers_by_columns_and_the_closers_by_rows():
    plan = Plan(tensor_parallel=2)
    for name, shape in param_schema(PAPER).items():
        where, leaf = placement(name, shape, plan), name.split(".")[-2]
        if leaf in ("w_q", "w_k", "w_v", "w_1"):
            assert (where.tensor_parallel, where.model_dim) == (COLUMN, len(shape) - 1), name
        elif leaf in ("w_o", "w_2"):  # the rows of the weight; the bias whole, added after the sum
            assert where.tensor_parallel == ROW and where.model_dim == (0 if name.endswith("weight") else None)
        else:  # embeddings, norms, the output projection: whole on every model rank
            assert where == (None, None, None), name


def test_fsdp_splits_the_first_dimension_tensor_parallel_leaves_whole():
    for name, shape in param_schema(LLAMA).items():
        alone = placement(name, shape, Plan(fsdp=2))
        assert alone.fsdp_dim == 0
        both = placement(name, shape, Plan(fsdp=2, tensor_parallel=2))
        assert both.fsdp_dim == (1 if both.model_dim == 0 else 0), name


@pytest.mark.parametrize("plan", [Plan(fsdp=2), Plan(tensor_parallel=2), Plan(fsdp=2, tensor_parallel=2)])
def test_the_pieces_of_every_weight_join_into_the_whole(plan):
    params = init_params(PAPER, seed=0, dtype="float64")
    shards = range(plan.fsdp)
    for name, whole in params.items():
        where = placement(name, whole.shape, plan)
        pieces = {(f, t): piece(whole, where, plan, f, t) for f in shards for t in range(plan.tensor_parallel)}
        sizes = {p.size for p in pieces.values()}
        split = (plan.fsdp if where.fsdp_dim is not None else 1) * (
            plan.tensor_parallel if where.model_dim is not None else 1
        )
        assert sizes == {whole.size // split}, name
        np.testing.assert_array_equal(join(pieces, where, plan), whole)


def test_fsdp_units_are_the_layers_then_the_rest_and_hold_every_weight_once():
    units = fsdp_units(PAPER)
    names = [n for _, unit in units for n in unit]
    assert sorted(names) == sorted(param_schema(PAPER))
    assert [u for u, _ in units] == ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1", ""]
    assert "tgt_embed.token.weight" in dict(units)[""]


# ------------------------------------------------------------------------------ the command line
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--fsdp", "2"], ("--fsdp 2", "37", "next-word")),
        (["--tensor-parallel", "2"], ("--tensor-parallel 2", "num_heads 3")),
        (["--heads", "4", "--tensor-parallel", "2"], ("tensor_parallel 2", "d_ff 37")),
        (["--fsdp", "2", "--data-parallel", "2"], ("data_parallel 2", "fsdp 2")),
        (["--heads", "5"], ("--heads 5", "d_model (36)")),
        (["--heads", "4", "--d-ff", "48", "--fsdp", "2", "--dtype", "bfloat16"], ("--fsdp 2", "bfloat16")),
        (
            ["--heads", "4", "--d-ff", "48", "--tensor-parallel", "2", "--data-parallel", "4"],
            ("6 rows", "4 data devices"),
        ),
    ],
)
def test_a_plan_the_task_cannot_run_is_one_line_and_status_2(capsys, argv, words):
    one_line_error(capsys, ["train", "--task", "next-word", "--steps", "1", *argv], *words)


def test_under_torchrun_a_plan_for_another_number_of_processes_is_one_line_and_status_2(capsys, monkeypatch):
    needs("torch")
    monkeypatch.setenv("WORLD_SIZE", "3")  # torchrun started 3 processes; the plan needs 2
    argv = ["--backend", "torch", "--heads", "4", "--d-ff", "48", "--fsdp", "2"]
    one_line_error(capsys, ["train", "--task", "next-word", "--steps", "1", *argv], "--fsdp 2", "2 devices", "3 are")


def test_the_train_command_trains_sharded_with_the_single_device_losses(capsys):
    from transformer_cli.main import main

    sizes = ["--task", "next-word", "--steps", "4", "--dtype", "float64", "--heads", "4", "--d-ff", "48"]
    assert main(["train", *sizes]) == 0
    single = capsys.readouterr().out
    assert main(["train", *sizes, "--fsdp", "2", "--tensor-parallel", "2"]) == 0
    sharded = capsys.readouterr().out
    assert "sharded over 4 devices (--fsdp 2 --tensor-parallel 2)" in sharded
    loss_line = [line for line in single.splitlines() if line.startswith("loss:")]
    assert loss_line and loss_line[0] in sharded  # the same first and last losses, to 4 decimals
