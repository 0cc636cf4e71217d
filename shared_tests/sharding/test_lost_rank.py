"""A run that loses a rank ends where the uninterrupted run ends, bit for bit. A rank is killed
(``transformer_run.faults``: SIGKILL, once) in the middle of step 3 (after its gradients, before the
update) or in the middle of step 4's checkpoint (its shards written, the step not committed); the
job restarts from the last committed checkpoint (step 2: the interrupted save is never read) and
its float64 losses and final weights and Adam moments are exactly the uninterrupted run's:

- torch: ``torchrun --standalone --nproc-per-node 2 --max-restarts 1`` running ``transformer-ref
  train --fsdp 2`` (torchrun starts both ranks again; the command goes on from --save DIR);
- JAX: ``transformer-ref train --fsdp 2 --tensor-parallel 2 --processes 2 --max-restarts 1`` (our
  launcher stops the other process and starts the job again);
- NumPy's simulated devices: a device raises ``LostDeviceError``; ``sharded_train(max_restarts=1)``.

processes.py starts ``python -m shared_tests.sharding.test_lost_rank FOLDER FRAMEWORK`` once per run
for torch and for JAX, side by side; each runs its three jobs (uninterrupted, lost mid-step, lost
mid-save) one after another, each job's output kept in FOLDER/lost-<framework>-<job>.log.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_run import sharded_checkpoint
from transformer_run.faults import ENVIRONMENT
from transformer_run.sharding import Plan
from transformer_spec import init_params

from .cases import adam_config, batch_of, schedule

STEPS, EVERY = 6, 2
FAULTS = {"uninterrupted": None, "mid-step": "step:3:1", "mid-save": "save:4:0"}
TRAIN = ["train", "--task", "next-word", "--heads", "4", "--d-ff", "48", "--dtype", "float64", "--dropout", "0.1",
         "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]  # fmt: skip
COMMANDS = {  # framework: (the launcher's argv before the command's, the command's plan options)
    "torch": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", "-m", "transformer_cli"], ["--backend", "torch", "--fsdp", "2"]),
    "jax": ([sys.executable, "-m", "transformer_cli"],
            ["--backend", "jax", "--fsdp", "2", "--tensor-parallel", "2", "--processes", "2", "--max-restarts", "1"]),
}  # fmt: skip
JOB_TIMEOUT = 240


def run_jobs(folder: str, framework: str) -> int:
    """The three jobs of ``framework``, in turn; -> the first failure's status."""
    launcher, plan = COMMANDS[framework]
    for job, fault in FAULTS.items():
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop(ENVIRONMENT, None)
        if fault:
            env[ENVIRONMENT] = f"{fault}:{folder}/lost-{framework}-{job}.fired"
        with open(f"{folder}/lost-{framework}-{job}.log", "w") as log:
            done = subprocess.run([*launcher, *TRAIN, *plan, "--save", f"{folder}/lost-{framework}-{job}"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT, cwd=folder)  # fmt: skip
        if done.returncode:
            print(f"{framework} {job}: exit status {done.returncode}, see {log.name}", file=sys.stderr)
            return done.returncode
    return 0


def _ended(folder, framework: str, job: str):
    """(losses, weights, moments) of the job's last committed checkpoint."""
    checkpoint = sharded_checkpoint.read(os.path.join(folder, f"lost-{framework}-{job}"))
    assert checkpoint.state.step == STEPS, f"{framework} {job}: ended at step {checkpoint.state.step}"
    params, moments = sharded_checkpoint.whole_tensors(checkpoint)
    return np.array(checkpoint.state.losses), params, moments


@pytest.fixture(scope="module", params=list(COMMANDS))
def jobs(request, sharded_runs):
    framework = request.param
    if not sharded_runs.available(f"lost-rank-{framework}"):
        pytest.skip(f"{framework} is not installed")
    run = sharded_runs[f"lost-rank-{framework}"]
    run.check()
    return run.folder, framework


@pytest.mark.parametrize("job", ["mid-step", "mid-save"])
def test_a_job_that_loses_a_rank_ends_bit_for_bit_where_the_uninterrupted_one_ends(jobs, job):
    """The fault fired (its marker exists; the job restarted), and the losses of all 6 steps and
    every weight and moment at the end equal the uninterrupted job's, exactly."""
    folder, framework = jobs
    assert os.path.exists(os.path.join(folder, f"lost-{framework}-{job}.fired")), f"{framework} {job}: no rank was lost"
    log = open(os.path.join(folder, f"lost-{framework}-{job}.log")).read()
    # what each launcher says of the lost process (torchrun, of the worker it restarts)
    restarted = "restart 1 of 1" in log if framework == "jax" else "exitcode: -9" in log
    assert restarted, f"{framework} {job}: the job did not restart:\n{log[-3000:]}"
    want_losses, want_params, want_moments = _ended(folder, framework, "uninterrupted")
    losses, params, moments = _ended(folder, framework, job)
    assert np.array_equal(losses, want_losses), f"{framework} {job}: {losses} vs {want_losses}"
    for got, want in ((params, want_params), (moments, want_moments)):
        different = [n for n in want if not np.array_equal(got[n], want[n])]
        assert not different, f"{framework} {job}: {different[:5]} differ"


# ------------------------------------------------------------------------------ NumPy, in this process
def _numpy_run(folder: str | None = None, fault: str | None = None, monkeypatch=None):
    import numpy_impl
    from numpy_impl.sharding import sharded_train

    if fault:
        monkeypatch.setenv(ENVIRONMENT, f"{fault}:{folder}/fired")
    config = adam_config("llama").replace(dropout=0.1)
    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    options = {"checkpoint_dir": f"{folder}/run", "checkpoint_every": EVERY, "max_restarts": 1} if folder else {}
    losses = sharded_train(model, [batch_of(config)], STEPS, schedule(config), seed=3,
                           plan=Plan(fsdp=2, tensor_parallel=2), **options)  # fmt: skip
    return np.array(losses), numpy_impl.to_params(model)


@pytest.mark.parametrize("fault", ["step:3:1", "save:4:2", "step:1:0"])
def test_numpy_s_run_that_loses_a_device_ends_bit_for_bit_where_the_uninterrupted_one_ends(tmp_path, monkeypatch,
                                                                                           fault, caplog):  # fmt: skip
    """FSDP 2 x TP 2 with dropout: device 1 lost in step 3, device 2 in step 4's save (a .partial
    step left, never read: the restart begins at step 2), device 0 in step 1 (no checkpoint yet:
    from the start); each restarted run's losses and weights are the uninterrupted run's, exactly."""
    want_losses, want_weights = _numpy_run()
    losses, weights = _numpy_run(str(tmp_path), fault, monkeypatch)
    assert (tmp_path / "fired").exists()
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
    raise SystemExit(run_jobs(sys.argv[1], sys.argv[2]))
