"""Training loses nothing: checkpoints are written atomically, a run killed at any moment (in the
middle of a save too) leaves its previous checkpoint loadable, and a resumed run continues the
float64 loss curve exactly as if it had never stopped (weights, Adam's moments and step, the
schedule's position, the batches, the dropout masks).

The last tests kill real ``transformer-ref train`` processes with SIGKILL: once while a save
is half written (a wrapper pauses the save's write half-way), once at a random moment."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from transformer_run.checkpoint import load_checkpoint, save_checkpoint
from transformer_run.data import NEXT_WORD, WordVocab, copy_task, next_word_batch
from transformer_run.schedules import warmup_schedule
from transformer_run.train import TrainingState
from transformer_spec import Config, WeightsFileError, init_params, load_params, save_params

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COPY = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=16, norm_first=True, dropout=0.1)
VOCAB = WordVocab.from_sentences(NEXT_WORD)
LM = Config.preset("tiny-lm", tgt_vocab_size=len(VOCAB), max_len=16, dropout=0.1)
RUNS = {
    "copy": (COPY, lambda: [copy_task(8, 5, 12, seed=s) for s in range(3)]),
    "next-word": (LM, lambda: [next_word_batch(NEXT_WORD, VOCAB)]),
}


# ------------------------------------------------------------------ in one process
@pytest.mark.parametrize("run", list(RUNS))
def test_a_run_resumed_from_its_checkpoint_file_continues_exactly(backend, run, tmp_path):
    """Dropout on, label smoothing on, float64: checkpoints every 4 steps; a new model built from the
    step-8 file and trained on gives the uninterrupted run's losses and weights, bit for bit."""
    config, batches = RUNS[run]
    schedule = warmup_schedule(config.d_model, 10)
    files = {}

    def checkpoint(state: TrainingState) -> None:
        files[state.step] = tmp_path / f"step{state.step}.safetensors"
        save_checkpoint(files[state.step], config, backend.impl.to_params(model), state, {"run": run})

    model = backend.impl.build_model(config, init_params(config, seed=2, dtype="float64"))
    full = backend.impl.train(model, batches(), 14, schedule, 0.1, seed=5, checkpoint=checkpoint, checkpoint_every=4)
    assert sorted(files) == [4, 8, 12, 14]
    saved = load_checkpoint(files[8])
    assert saved.state.step == 8 and saved.state.losses == full[:8] and saved.run == {"run": run}
    resumed_model = backend.impl.build_model(saved.config, saved.params)
    resumed = backend.impl.train(resumed_model, batches(), 14, schedule, 0.1, seed=5, resume=saved.state)
    assert resumed == full, f"resumed losses differ by {np.max(np.abs(np.subtract(resumed, full))):.2e}"
    ours, theirs = backend.impl.to_params(resumed_model), backend.impl.to_params(model)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_the_state_holds_adam_moments_in_the_weights_layout_equal_in_every_backend(backend, reference):
    """One step from the same weights, dropout off: the same moments (to rounding) under the same
    names, [in, out] like the weights, whatever layout the framework keeps them in."""
    config, batches = RUNS["copy"]
    config = config.replace(dropout=0.0)
    states = {}
    for b in (reference, backend):
        model = b.impl.build_model(config, init_params(config, seed=2, dtype="float64"))
        b.impl.train(
            model, batches(), 2, warmup_schedule(config.d_model, 10), checkpoint=states.setdefault(b.name, []).append
        )
    want, got = states[reference.name][-1], states[backend.name][-1]
    assert got.step == want.step == 2 and sorted(got.moments) == sorted(want.moments)
    # The key-projection bias's gradient is zero in exact arithmetic (softmax is shift-invariant):
    # its moments are rounding noise (~1e-19, its sign set by the thread count's summation order),
    # held to 1e-12 of the largest moment of its kind, as tolerances.py's parity_floor does.
    scale = {kind: max(float(np.abs(v).max()) for n, v in want.moments.items() if n[0] == kind) for kind in "mv"}
    for name, value in want.moments.items():
        assert got.moments[name].shape == value.shape, name
        atol = 1e-12 * scale[name[0]]
        np.testing.assert_allclose(got.moments[name], value, rtol=1e-9, atol=atol, err_msg=name)


def test_a_checkpoint_is_a_weights_file_every_backend_loads(backend, tmp_path):
    config, batches = RUNS["next-word"]
    path = tmp_path / "run.safetensors"
    model = backend.impl.build_model(config, init_params(config, dtype="float64"))

    def checkpoint(state):
        save_checkpoint(path, config, backend.impl.to_params(model), state, {})

    backend.impl.train(model, batches(), 3, warmup_schedule(config.d_model, 10), checkpoint=checkpoint)
    params, stored = load_params(path)
    assert stored == config and sorted(params) == sorted(backend.impl.to_params(model))
    loaded = backend.impl.load_model(str(path))
    assert all(np.array_equal(v, backend.impl.to_params(model)[k]) for k, v in backend.impl.to_params(loaded).items())


def test_a_weights_file_is_not_a_checkpoint_and_a_spoiled_state_is_refused(tmp_path):
    config, _ = RUNS["next-word"]
    save_params(tmp_path / "w.safetensors", init_params(config), config)
    with pytest.raises(WeightsFileError, match="holds weights only"):
        load_checkpoint(tmp_path / "w.safetensors")
    params = init_params(config)
    moments = {f"{w}.{k}": np.zeros_like(v) for k, v in params.items() for w in ("m", "v")}
    state = TrainingState(2, [3.0, 2.5], moments, None)
    save_checkpoint(tmp_path / "c.safetensors", config, params, state, {})
    assert load_checkpoint(tmp_path / "c.safetensors").state.losses == [3.0, 2.5]
    with pytest.raises(WeightsFileError, match="training state that is not a step count"):
        save_checkpoint(tmp_path / "c.safetensors", config, params, TrainingState(3, [1.0], moments, None), {})
    with pytest.raises(Exception, match=r"missing keys \['optimizer.m.decoder.norm.bias'\]"):
        save_checkpoint(tmp_path / "c.safetensors", config, params,
                        TrainingState(2, [3.0, 2.5], {k: v for k, v in moments.items() if k != "m.decoder.norm.bias"}, None), {})  # fmt: skip
    with pytest.raises(Exception, match="loss is not finite at steps"):
        save_checkpoint(
            tmp_path / "c.safetensors", config, params, TrainingState(2, [3.0, float("nan")], moments, None), {}
        )
    assert load_checkpoint(tmp_path / "c.safetensors").state.step == 2, "a refused save leaves the old checkpoint"


# ------------------------------------------------------------------ real processes, killed
# float64 with dropout and label smoothing, so that every part of the state matters; a checkpoint
# every 5 steps.
STEPS = 60
EVERY = 5
TRAIN = ["train", "--task", "next-word", "--dtype", "float64", "--dropout", "0.1", "--label-smoothing", "0.1",
         "--seed", "3", "--warmup", "30", "--checkpoint-every", str(EVERY)]  # fmt: skip

# transformer-ref, its run slowed by a sleep after each step (the numbers are untouched: the run
# lasts long enough to be killed at a random step), and the n-th save of a checkpoint paused
# half-way through its write (the temporary file half written, not yet renamed): the moment a
# kill hurts most.
STEP_DELAY = 0.02
HOOKED_TRAIN = textwrap.dedent(
    """
    import io, os, sys, time
    import transformer_cli.train as train_command
    import transformer_spec.io as weights_io
    from transformer_cli.main import main

    pause_at, saves = int(os.environ.get("PAUSE_AT_SAVE", "0")), 0
    write_atomically, progress = weights_io.write_atomically, train_command.ProgressBar.__call__

    def paused(path, write):
        def half_then_pause(f):
            global saves
            buffer = io.BytesIO()
            write(buffer)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            saves += 1
            if saves == pause_at:
                print("paused in save", saves, file=sys.stderr, flush=True)
                time.sleep(600)
            f.write(data[len(data) // 2 :])

        return write_atomically(path, half_then_pause)

    def slowed(self, step, loss):
        progress(self, step, loss)
        time.sleep(float(os.environ["STEP_DELAY"]))

    weights_io.write_atomically = paused
    train_command.ProgressBar.__call__ = slowed
    sys.exit(main(sys.argv[1:]))
    """
)


def start(argv: list[str], pause_at_save: int = 0) -> subprocess.Popen:
    env = os.environ | {"PYTHONHASHSEED": str(random.randrange(1000)), "PAUSE_AT_SAVE": str(pause_at_save),
                        "STEP_DELAY": str(STEP_DELAY)}  # fmt: skip
    return subprocess.Popen([sys.executable, "-c", HOOKED_TRAIN, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended ({process.returncode}) before {what}: {process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.005)


def kill(process: subprocess.Popen) -> None:
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


def step_in(path) -> int:
    return load_checkpoint(path).state.step if os.path.exists(path) else 0


def finish(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "transformer_cli", *argv], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_a_killed_run_resumes_to_the_uninterrupted_loss_curve(framework, tmp_path):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "flax"}[framework])
    steps = STEPS
    argv = [*TRAIN, "--backend", framework, "--steps", str(steps)]
    whole = tmp_path / "whole.safetensors"
    finish([*argv, "--save", str(whole)])
    want = load_checkpoint(whole)
    assert want.state.step == steps and len(want.state.losses) == steps

    # 1. killed while the 3rd checkpoint is half written: the 2nd is still there, whole
    path = tmp_path / "run.safetensors"
    process = start([*argv, "--save", str(path)], pause_at_save=3)
    wait_for(lambda: "paused in save 3" in (process.stderr.readline() or ""), process, "the 3rd save")
    kill(process)
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith(".run.safetensors.")]
    assert len(leftovers) == 1, os.listdir(tmp_path)
    with pytest.raises(WeightsFileError):
        load_params(tmp_path / leftovers[0])  # half a file: what a save in place would have left
    assert load_checkpoint(path).state.step == 2 * EVERY

    # 2. resumed, then killed at a random moment after at least one more checkpoint, well before
    # the end (each step lasts at least STEP_DELAY)
    process = start(["train", "--resume", str(path)])
    wait_for(lambda: step_in(path) > 2 * EVERY, process, "a checkpoint after resuming")
    time.sleep(random.uniform(0.0, (steps - 4 * EVERY) * STEP_DELAY))
    kill(process)
    stopped = load_checkpoint(path)
    assert 2 * EVERY < stopped.state.step < steps and stopped.state.step % EVERY == 0
    assert stopped.state.losses == want.state.losses[: stopped.state.step]

    # 3. resumed to the end: every loss and every weight as in the uninterrupted run
    finish(["train", "--resume", str(path)])
    got = load_checkpoint(path)
    assert got.state.step == steps
    difference = np.max(np.abs(np.subtract(got.state.losses, want.state.losses)))
    assert got.state.losses == want.state.losses, f"loss curves differ by up to {difference:.2e}"
    assert all(np.array_equal(got.params[k], want.params[k]) for k in want.params)
    assert all(np.array_equal(got.state.moments[k], want.state.moments[k]) for k in want.state.moments)
    assert got.run == want.run and json.dumps(got.state.dropout) == json.dumps(want.state.dropout)
