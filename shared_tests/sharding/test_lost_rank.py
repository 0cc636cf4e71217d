"""A run that loses a rank ends where the uninterrupted run ends, bit for bit. A job loses a rank
twice (``transformer_run.faults``: SIGKILL, each once): rank 1 in the middle of step 3 (after its
gradients, before the update), then, restarted, rank 0 in the middle of step 4's checkpoint (its
shards written, the step not committed); each time it restarts from the last committed checkpoint
(step 2: the interrupted save is never read), and its float64 losses and final weights and Adam
moments are exactly the uninterrupted run's:

- torch: ``torchrun --standalone --nproc-per-node 2 --max-restarts 2`` running ``transformer-ref
  train --fsdp 2`` (torchrun starts both ranks again; the command goes on from --save DIR);
- JAX: ``transformer-ref train --fsdp 2 --tensor-parallel 2 --processes 2 --max-restarts 2`` (our
  launcher stops the other process and starts the job again);
- NumPy's simulated devices: a device raises ``LostDeviceError``; ``sharded_train(max_restarts=1)``.

processes.py starts ``python -m shared_tests.sharding.test_lost_rank FOLDER FRAMEWORK`` once per run
for torch and for JAX, side by side; each runs its two jobs (uninterrupted, then the one that loses
a rank twice: both faults in one job, one launch fewer than a job each) one after the other, both
launchers called in that process (``torch.distributed.run.main``, the program behind the torchrun
command; ``transformer_cli.main.main``, behind transformer-ref): the jobs are the commands', and the
launcher's imports, and JAX's fork server, are paid once for both. Their output, the launchers' and
the ranks', goes to FOLDER/lost-<framework>.log; each job's last committed step is consolidated into
FOLDER/lost-<framework>-<job>.safetensors.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

from transformer_run import sharded_checkpoint
from transformer_run.faults import ENVIRONMENT
from transformer_run.sharding import Plan
from transformer_spec import init_params

from .cases import adam_config, batch_of, schedule

STEPS, EVERY = 6, 2
FAULTS = {"mid-step": "step:3:1", "mid-save": "save:4:0"}  # what each fault is, in the order they fire
JOBS = ("uninterrupted", "lost")  # the second job has every fault of FAULTS
TRAIN = ["train", "--task", "next-word", "--heads", "4", "--d-ff", "48", "--dtype", "float64", "--dropout", "0.1",
         "--steps", str(STEPS)]  # fmt: skip
# the lost job checkpoints every EVERY steps; the uninterrupted one saves only its last (what the tests
# read), so its numbers owe nothing to saving: a save that disturbed the run would show
SAVE_EVERY = {"uninterrupted": STEPS, "lost": EVERY}
LAUNCHERS = {  # framework: (the launcher's options before the command's, the command's plan options)
    "torch": (["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "-m", "transformer_cli"],
              ["--backend", "torch", "--fsdp", "2"]),
    "jax": ([], ["--backend", "jax", "--fsdp", "2", "--tensor-parallel", "2", "--processes", "2", "--max-restarts", "2"]),
}  # fmt: skip


def _launch(framework: str, argv: list[str]) -> int:
    """One job, its launcher called here: torchrun's (which starts the command's ranks as fresh
    interpreters, and again after a loss) or transformer-ref's (whose --processes launcher forks
    them from its fork server); -> its exit status."""
    try:
        if framework == "torch":
            from torch.distributed import run
            from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

            try:
                run.main(argv)
            except ChildFailedError:  # torchrun's report of it is in the log
                return 1
            return 0
        from transformer_cli.main import main

        return main(argv)
    except SystemExit as exit:  # a usage error: one line in the log
        return exit.code if isinstance(exit.code, int) else 1


def run_jobs(folder: str, framework: str) -> int:
    """The two jobs of ``framework``, in turn; -> the first failure's status (the log's end on the
    standard error this process was given)."""
    options, plan = LAUNCHERS[framework]
    given = {stream: os.dup(stream) for stream in (1, 2)}
    with open(f"{folder}/lost-{framework}.log", "w") as log:
        for stream in given:  # what the ranks started from here write, too
            os.dup2(log.fileno(), stream)
        try:
            for job in JOBS:
                os.environ.pop(ENVIRONMENT, None)
                if job == "lost":
                    os.environ[ENVIRONMENT] = ",".join(f"{fault}:{folder}/lost-{framework}-{name}.fired"
                                                       for name, fault in FAULTS.items())  # fmt: skip
                print(f"--- {framework} {job}", flush=True)
                save = ["--checkpoint-every", str(SAVE_EVERY[job]), "--save", f"{folder}/lost-{framework}-{job}"]
                code = _launch(framework, [*options, *TRAIN, *plan, *save])
                if code:
                    print(f"{framework} {job}: exit status {code}", flush=True)
                    break
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for stream, where in given.items():
                os.dup2(where, stream)
    if code:
        print(f"{framework} {job}: exit status {code}; its log ends:\n{open(log.name).read()[-5000:]}", file=sys.stderr)
        return code
    for job in JOBS:
        # each job's last committed step as one file, for the tests (read here, after both jobs: the
        # framework's checkpoint readers, Orbax's threads among them, stay out of the pytest workers,
        # and JAX's backend out of this process until its launches are done)
        sharded_checkpoint.consolidate(f"{folder}/lost-{framework}-{job}", f"{folder}/lost-{framework}-{job}.safetensors")
    return 0


def _ended(folder, framework: str, job: str):
    """(losses, weights, moments) of the job's last committed checkpoint (run_jobs consolidated it)."""
    from transformer_run.checkpoint import load_checkpoint

    ended = load_checkpoint(os.path.join(folder, f"lost-{framework}-{job}.safetensors"))
    assert ended.state.step == STEPS, f"{framework} {job}: ended at step {ended.state.step}"
    return np.array(ended.state.losses), ended.params, ended.state.moments


@pytest.fixture(scope="module", params=list(LAUNCHERS))
def jobs(request, sharded_runs):
    framework = request.param
    if not sharded_runs.available(f"lost-rank-{framework}"):
        pytest.skip(f"{framework} is not installed")
    run = sharded_runs[f"lost-rank-{framework}"]
    run.check()
    return run.folder, framework


def test_a_job_that_loses_a_rank_ends_bit_for_bit_where_the_uninterrupted_one_ends(jobs):
    """Both faults fired (their markers exist) and the job restarted twice; the losses of all 6
    steps and every weight and moment at the end equal the uninterrupted job's, exactly."""
    folder, framework = jobs
    for fault in FAULTS:
        assert os.path.exists(os.path.join(folder, f"lost-{framework}-{fault}.fired")), f"{framework}: no rank lost {fault}"
    log = open(os.path.join(folder, f"lost-{framework}.log")).read()
    # what each launcher says of a lost process (torchrun, of the worker it restarts)
    restarts = log.count("restart 2 of 2") + log.count("restart 1 of 2") if framework == "jax" else log.count("exitcode: -9")
    assert restarts == 2, f"{framework}: {restarts} restarts, not 2:\n{log[-3000:]}"
    want_losses, want_params, want_moments = _ended(folder, framework, "uninterrupted")
    losses, params, moments = _ended(folder, framework, "lost")
    assert np.array_equal(losses, want_losses), f"{framework}: {losses} vs {want_losses}"
    for got, want in ((params, want_params), (moments, want_moments)):
        different = [n for n in want if not np.array_equal(got[n], want[n])]
        assert not different, f"{framework}: {different[:5]} differ"


# ------------------------------------------------------------------------------ NumPy, in this process
def _numpy_run(folder: str | None = None, fault: str | None = None, monkeypatch=None):
    import numpy_impl
    from numpy_impl.sharding import sharded_train

    if fault:  # each fault its own marker: fired-0, fired-1, ...
        monkeypatch.setenv(ENVIRONMENT, ",".join(f"{one}:{folder}/fired-{i}" for i, one in enumerate(fault.split(","))))
    config = adam_config("llama").replace(dropout=0.1)
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    options = {"checkpoint_dir": f"{folder}/run", "checkpoint_every": EVERY, "max_restarts": fault.count(",") + 1} if folder else {}
    losses = sharded_train(model, [batch_of(config)], STEPS, schedule(config), seed=3,
                           plan=Plan(fsdp=2, tensor_parallel=2), **options)  # fmt: skip
    return np.array(losses), numpy_impl.to_params(model)


@functools.cache
def _numpy_uninterrupted():
    """The uninterrupted run every faulted one is held to (computed once: the tests only read it)."""
    return _numpy_run()


@pytest.mark.parametrize("fault", ["step:3:1", "save:4:2", "step:1:0", "step:3:1,save:4:2"])
def test_numpy_s_run_that_loses_a_device_ends_bit_for_bit_where_the_uninterrupted_one_ends(tmp_path, monkeypatch,
                                                                                           fault, caplog):  # fmt: skip
    """FSDP 2 x TP 2 with dropout: device 1 lost in step 3, device 2 in step 4's save (a .partial
    step left, never read: the restart begins at step 2), device 0 in step 1 (no checkpoint yet:
    from the start), and devices 1 then 2 in one run (restarted twice); each restarted run's losses
    and weights are the uninterrupted run's, exactly."""
    want_losses, want_weights = _numpy_uninterrupted()
    losses, weights = _numpy_run(str(tmp_path), fault, monkeypatch)
    assert all((tmp_path / f"fired-{i}").exists() for i in range(fault.count(",") + 1))
    assert "restarting from" in caplog.text
    assert np.array_equal(losses, want_losses)
    assert all(np.array_equal(weights[n], w) for n, w in want_weights.items())
    assert sharded_checkpoint.committed_steps(tmp_path / "run") == [4, 6]


def test_a_lost_device_without_restarts_ends_the_run(tmp_path, monkeypatch):
    """max_restarts 0: the loss of a device is the run's end, in one line naming it."""
    import numpy_impl
    from numpy_impl.sharding import sharded_train
    from transformer_run.faults import LostDeviceError

    monkeypatch.setenv(ENVIRONMENT, f"step:2:3:{tmp_path}/fired")
    config = adam_config("llama")
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    with pytest.raises(LostDeviceError, match="device 3 lost in the middle of step 2"):
        sharded_train(model, [batch_of(config)], STEPS, schedule(config), plan=Plan(fsdp=4))


def test_a_fault_spec_that_means_nothing_is_refused(monkeypatch):
    from transformer_run.faults import maybe_fail

    monkeypatch.setenv(ENVIRONMENT, "midway:3")
    with pytest.raises(ValueError, match=r"expected <step\|save>:<step>:<rank>:<marker file>"):
        maybe_fail("step", 3, 0)


if __name__ == "__main__":  # a framework's jobs: python -m shared_tests.sharding.test_lost_rank FOLDER FRAMEWORK
    os.chdir(sys.argv[1])  # what a launcher writes where it runs stays in the run's folder
    raise SystemExit(run_jobs(sys.argv[1], sys.argv[2]))
