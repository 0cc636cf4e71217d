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
