"""``train --processes N`` (JAX's sharded plan on one mesh over N processes) refuses what cannot run
in one line and exit status 2, before any process starts: another backend, no plan, a plan whose
devices do not split evenly over the processes, a process id out of range or without a
coordinator, a process id without --processes, a coordinator for the local launcher (which starts
its own). The runs themselves are shared_tests/sharding/test_jax_processes.py's."""

from __future__ import annotations

import pytest

from ..helpers import needs, one_line_error

PLAN = ["--task", "next-word", "--heads", "4", "--d-ff", "48", "--fsdp", "2", "--tensor-parallel", "2"]


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch):
    """Not inside a multi-process run: no process id or coordinator in the environment."""
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--backend", "torch", *PLAN, "--processes", "2"], ["--processes 2", "the jax backend's"]),
        (["--backend", "jax", "--processes", "2"], ["--processes 2", "give --fsdp or --tensor-parallel"]),
        (["--backend", "jax", *PLAN, "--processes", "3"], ["--processes 3", "4 devices do not split evenly"]),
        (
            ["--backend", "jax", *PLAN, "--processes", "2", "--process-id", "2", "--coordinator", "node0:1234"],
            ["--process-id 2", "numbers them 0 .. 1"],
        ),
        (["--backend", "jax", *PLAN, "--processes", "2", "--process-id", "1"], ["--process-id 1", "--coordinator"]),
        (["--backend", "jax", *PLAN, "--process-id", "1"], ["--process-id 1", "give --processes N too"]),
        (
            ["--backend", "jax", *PLAN, "--processes", "2", "--coordinator", "node0:1234"],
            ["--coordinator node0:1234", "started with --process-id"],
        ),
    ],
    ids=[
        "torch",
        "no-plan",
        "uneven",
        "id-out-of-range",
        "no-coordinator",
        "id-without-processes",
        "coordinator-of-the-launcher",
    ],
)
def test_what_cannot_run_across_processes_is_one_line_and_status_2(capsys, options, words):
    needs("jax")
    one_line_error(capsys, ["train", *options], *words)
