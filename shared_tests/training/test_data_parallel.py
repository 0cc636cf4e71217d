"""Data parallel changes nothing but speed: N replicas' step is the single-device step on the whole batch.

Each backend's ``data_parallel_loss_and_grads`` (torch: 2 DistributedDataParallel processes over
gloo; JAX: a mesh of 4 simulated CPU devices; NumPy: 2 and 4 shards) must give the gradients of
``loss_and_grads`` on the same global batch, and ``data_parallel_train`` the single-device loss
curve. The batch is padded unevenly (the shards hold 16, 12, 5 and 3 of its 36 real targets),
so a mean of per-shard means, the classic mistake, would fail (it is shown to, below).

torch and JAX run in a fresh process each (``python -m shared_tests.training.test_data_parallel``):
JAX's simulated devices must be asked for before JAX is imported, and DDP spawns processes.
Both are started at once and run side by side; a child that fails shows its stderr.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from transformer_backends.tolerances import TOLERANCE
from transformer_run.data_parallel import check_data_parallel, shard, shard_weights
from transformer_run.mixed_precision import BUDGET as BF16_BUDGET
from transformer_run.mixed_precision import gradients_error
from transformer_run.schedules import warmup_schedule
from transformer_spec import Config, init_params

from ..helpers import needs, one_line_error, padded_batch
from ..tolerances import CURVE_TOLERANCE

ROOT = pathlib.Path(__file__).resolve().parents[2]
LM, LLAMA = Config.preset("tiny-lm"), Config.preset("tiny-llama")
REPLICAS = {"torch": 2, "jax": 4}  # processes / simulated devices
STEPS = 20
# A tensor's gradient error is max |diff| / max(its max |grad|, FLOOR * the model's max |grad|): the
# floor keeps a gradient that is zero in exact arithmetic (the key-projection bias, ~1e-8 of the
# model's largest in float32) from being measured relative to its own rounding noise. float32's is
# wider: there that noise alone, single device against float64, reads 1.2e-5 at a 1e-3 floor.
FLOOR = {"float64": 1e-3, "float32": 1e-2}
CHILD_TIMEOUT = 240  # seconds; the children take ~15 s here, side by side
DROPOUT, DROPOUT_STEPS, DROPOUT_SEED = 0.3, 3, 1  # the runs with dropout: each backend against its own



def schedule(config: Config):
    return warmup_schedule(config.d_model, warmup_steps=400, factor=0.5)  # test_training's curve schedule


def gradient_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray], dtype: str = "float64") -> float:
    """The worst tensor's max |diff| / max(|grad|, floor) (see FLOOR)."""
    assert list(got) == list(want)
    model_scale = max(float(np.abs(g).max()) for g in want.values())
    return max(
        float(np.abs(np.asarray(got[name], np.float64) - want[name]).max())
        / max(float(np.abs(want[name]).max()), FLOOR[dtype] * model_scale)
        for name in want
    )


# ------------------------------------------------------------------------------ NumPy, the reference
@pytest.mark.parametrize("config", [LM, LLAMA], ids=["tiny-lm", "tiny-llama"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shards", [2, 4])
def test_numpy_shards_give_the_single_device_gradients(config, dtype, shards):
    import numpy_impl

    model = numpy_impl.build_model(config, init_params(config, seed=0, dtype=dtype))
    batch = padded_batch(config)
    want_loss, want = numpy_impl.loss_and_grads(model, batch)
    loss, grads = numpy_impl.data_parallel_loss_and_grads(model, batch, shards)
    assert abs(loss - want_loss) / want_loss <= TOLERANCE[dtype]
    assert all(g.dtype == np.dtype(dtype) for g in grads.values())
    error = gradient_error(grads, want, dtype)
    assert error <= TOLERANCE[dtype], f"{shards} shards, {dtype}: gradients differ by {error:.2e}"


def test_a_mean_of_per_shard_means_is_not_the_single_device_step():
    """The shards hold different numbers of real targets: averaging their means weighs a shard of
    3 targets as much as one of 16. The data-parallel step weighs each by its share instead."""
    import numpy_impl

    model = numpy_impl.build_model(LM, init_params(LM, seed=0, dtype="float64"))
    batch = padded_batch(LM)
    assert shard_weights(LM, batch, 4) == [16 / 36, 12 / 36, 5 / 36, 3 / 36]
    want_loss, want = numpy_impl.loss_and_grads(model, batch)
    per_shard = [numpy_impl.loss_and_grads(model, shard(LM, batch, r, 4)) for r in range(4)]
    mean_loss = sum(loss for loss, _ in per_shard) / 4
    mean_grads = {name: sum(grads[name] for _, grads in per_shard) / 4 for name in want}
    assert abs(mean_loss - want_loss) / want_loss > 1e-3
    assert gradient_error(mean_grads, want) > 1e-2  # what the tests above would catch
    assert gradient_error(numpy_impl.data_parallel_loss_and_grads(model, batch, 4)[1], want) <= 1e-12


def test_numpy_data_parallel_adam_steps_follow_the_single_device_curve():
    import numpy_impl

    params = init_params(LM, seed=0, dtype="float64")
    want = np.array(numpy_impl.train(numpy_impl.build_model(LM, params), [padded_batch(LM)], STEPS, schedule(LM)))
    for shards in (2, 4):
        model = numpy_impl.build_model(LM, params)
        losses = np.array(
            numpy_impl.data_parallel_train(model, [padded_batch(LM)], STEPS, schedule(LM), data_parallel=shards)
        )
        error = float(np.max(np.abs(losses - want) / want))
        assert error <= CURVE_TOLERANCE, f"{shards} shards: loss curves differ by {error:.2e}"
    assert want[-1] < want[0]


def with_dropout(impl, train, seed: int = DROPOUT_SEED, **kwargs) -> tuple[np.ndarray, object]:
    """DROPOUT_STEPS float64 Adam steps of tiny-lm with dropout DROPOUT by ``train`` (``impl.train``, or
    ``impl.data_parallel_train`` with ``data_parallel=N``) from ``seed``: (each step's loss, the model)."""
    config = LM.replace(dropout=DROPOUT)
    model = impl.build_model(config, init_params(config, seed=0, dtype="float64"))
    losses = train(model, [padded_batch(config)], DROPOUT_STEPS, schedule(config), seed=seed, **kwargs)
    return np.array(losses), model


@pytest.mark.parametrize("shards", [2, 4])
def test_with_dropout_the_replicas_step_is_the_single_device_step_with_the_same_seed(shards):
    """Every replica draws the one device's mask of the whole batch, from the one device's streams,
    and keeps its rows (sharding.py's ``WholeMaskDropout``): 3 float64 Adam steps with dropout 0.3 are
    the single device's from the same seed, to 1e-12, and the streams end where its end; another seed
    is another run. torch's and JAX's replicas: test_data_parallel_step_equals_the_single_device_step."""
    import numpy_impl
    from numpy_impl.train import dropout_streams

    want, one = with_dropout(numpy_impl, numpy_impl.train)
    got, replicas = with_dropout(numpy_impl, numpy_impl.data_parallel_train, data_parallel=shards)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE["float64"])
    assert dropout_streams(replicas) == dropout_streams(one)
    other, _ = with_dropout(numpy_impl, numpy_impl.data_parallel_train, DROPOUT_SEED + 1, data_parallel=shards)
    assert np.max(np.abs(other / want - 1)) > 1e-3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--data-parallel", "0"], ["--data-parallel", "positive integer"]),
        (["--task", "translate", "--data-parallel", "4"], ["--data-parallel 4", "6 rows", "evenly"]),
        (["--task", "translate", "--data-parallel", "7"], ["--data-parallel 7", "more replicas", "(6)"]),
        (["--data-parallel", "2", "--save", "run.safetensors"], ["--data-parallel 2", "--save"]),
    ],
)
def test_a_bad_data_parallel_option_is_one_line_and_status_2(capsys, argv, words):
    one_line_error(capsys, ["train", *argv], *words)
    assert "training" not in capsys.readouterr().out


def test_the_train_command_trains_data_parallel_with_the_single_device_losses(capsys, children):
    """NumPy in this process; torch as a user runs it, spawning its 2 DDP processes itself."""
    from transformer_cli.main import main

    children.start("torch-command")
    assert main(["train", "--task", "next-word", "--steps", "5"]) == 0
    single = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss: ")]
    assert main(["train", "--task", "next-word", "--steps", "5", "--data-parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "data parallel over 2 replicas" in out
    assert [line for line in out.splitlines() if line.startswith("loss: ")] == single
    out = children.results("torch-command")["stdout"]
    assert "torch (float32)" in out and "data parallel over 2 replicas" in out
    assert [line for line in out.splitlines() if line.startswith("loss: ")] == single  # 4 decimals


@pytest.mark.parametrize(("rows", "replicas"), [(8, 0), (8, 3), (2, 4), (8, -1)])
def test_a_batch_that_does_not_split_evenly_is_refused(rows, replicas):
    with pytest.raises(ValueError, match="data_parallel|replicas"):
        check_data_parallel(rows, replicas)


# ------------------------------------------------------------------------------ torch DDP and JAX's mesh
def child(backend: str, out: str, rank: int = 0, init_file: str = "") -> None:
    """In a fresh process: the data-parallel gradients (float64, float32) and 20 float64 Adam steps,
    written to ``out`` (.npz, by rank 0) for the test to hold to the single-device step. torch: this
    process is DDP replica ``rank`` of a group met through ``init_file``, as torchrun's would be."""
    if backend == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    else:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=REPLICAS["torch"])
    impl = importlib.import_module(f"{backend}_impl")
    batch, results = padded_batch(LM), {}
    for dtype in ("float64", "float32"):
        model = impl.build_model(LM, init_params(LM, seed=0, dtype=dtype))
        loss, grads = impl.data_parallel_loss_and_grads(model, batch, REPLICAS[backend])
        results[f"{dtype}/loss"] = loss
        results |= {f"{dtype}/grad/{name}": grad for name, grad in grads.items()}
    model = impl.build_model(LM, init_params(LM, seed=0, dtype="float32"))
    loss, grads = impl.data_parallel_loss_and_grads(model, batch, REPLICAS[backend], compute_dtype="bfloat16")
    results["bfloat16/loss"] = loss
    results |= {f"bfloat16/grad/{name}": grad for name, grad in grads.items()}
    model = impl.build_model(LM, init_params(LM, seed=0, dtype="float64"))
    results["curve"] = impl.data_parallel_train(model, [batch], STEPS, schedule(LM), data_parallel=REPLICAS[backend])
    results["dropout"] = with_dropout(impl, impl.data_parallel_train, data_parallel=REPLICAS[backend])[0]
    if backend == "jax":
        from jax_impl.data_parallel import data_parallel_mesh, shard_batch

        sharded = shard_batch(batch, data_parallel_mesh(REPLICAS["jax"]))["ids"]
        results["devices"] = len(sharded.sharding.device_set)
        results["rows_per_device"] = sharded.sharding.shard_shape(sharded.shape)[0]
    if rank == 0:
        np.savez(out, **results)
    if backend == "torch":
        dist.barrier()  # as torch_impl's spawned replicas do: no rank tears the group down under another
        dist.destroy_process_group()


def child_commands(name: str, folder: pathlib.Path) -> tuple[list[list[str]], dict[str, str], pathlib.Path | None]:
    """-> (the commands of child ``name``, their environment, the .npz they write or None)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if name == "torch-command":  # the command spawns its own 2 DDP processes (torch.multiprocessing.spawn)
        command = [sys.executable, "-m", "transformer_cli", "train", "--task", "next-word", "--steps", "5",
                   "--backend", "torch", "--data-parallel", "2"]  # fmt: skip
        return [command], env, None
    out = folder / f"{name}.npz"
    command = [sys.executable, "-m", "shared_tests.training.test_data_parallel", name, str(out)]
    if name == "jax":  # before JAX is imported: the CPU as 4 devices (XLA's light code generation comes
        # with the run's XLA_FLAGS, conftest.py's; the gradients stay within 1.1e-14 of the single device's)
        flag = f"--xla_force_host_platform_device_count={REPLICAS['jax']}"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        return [command], env, out
    # torch: one process per replica, meeting through a file (no port to clash)
    return [command + [str(rank), str(folder / "rendezvous")] for rank in range(REPLICAS["torch"])], env, out


class Children:
    """The child processes, each started once. In a serial run the first test that needs one starts
    them all, to run side by side; under xdist a worker starts only those its tests need."""

    NAMES = ("torch", "jax", "torch-command")

    def __init__(self, folder: pathlib.Path):
        self.folder, self.started = folder, {}

    def start(self, name: str) -> None:
        """Start child ``name`` (and in a serial run every other one), those whose framework is installed."""
        names = [name] if os.environ.get("PYTEST_XDIST_WORKER") else self.NAMES
        for each in names:
            if each not in self.started and importlib.util.find_spec(each.split("-")[0]) is not None:
                commands, env, out = child_commands(each, self.folder)
                processes = [
                    subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for c in commands
                ]
                self.started[each] = (processes, out)

    def results(self, name: str) -> dict[str, np.ndarray]:
        """Wait for child ``name``: its .npz, or {"stdout": ...}; its stderr in the failure if it failed."""
        if importlib.util.find_spec(name.split("-")[0]) is None:
            pytest.skip(f"{name.split('-')[0]} is not installed")
        self.start(name)
        processes, out = self.started[name]
        reports, outputs = [], []
        for rank, process in enumerate(processes):
            try:
                stdout, stderr = process.communicate(timeout=CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            outputs.append(stdout)
            if process.returncode != 0:
                reports.append(
                    f"{name} process {rank} exited with {process.returncode} (a negative status is the signal "
                    f"that killed it)\n--- its stdout ---\n{stdout}\n--- its stderr ---\n{stderr}"
                )
        if reports or (out is not None and not out.exists()):
            raise AssertionError("\n".join(reports) or f"the {name} child wrote no results")
        return dict(np.load(out)) if out is not None else {"stdout": outputs[0]}

    def stop(self) -> None:
        for processes, _ in self.started.values():
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.communicate()


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    started = Children(tmp_path_factory.mktemp("data-parallel"))
    yield started
    started.stop()


@pytest.mark.parametrize("backend", list(REPLICAS))
def test_data_parallel_step_equals_the_single_device_step(children, backend):
    """torch: 2 DDP processes; JAX: 4 simulated devices. Gradients (float64, float32) against the same
    backend's single device, 20 float64 Adam steps against the single-device loss curve, and 3 with
    dropout against the same backend's single device from the same seed (each replica draws the one
    device's masks and keeps its rows; the masks are each framework's generator's)."""
    import numpy_impl

    needs(backend)
    children.start(backend)
    impl = importlib.import_module(f"{backend}_impl")
    want = {}  # while the children run
    for dtype in ("float64", "float32"):
        model = impl.build_model(LM, init_params(LM, seed=0, dtype=dtype))
        want[dtype] = impl.loss_and_grads(model, padded_batch(LM))
    model = impl.build_model(LM, init_params(LM, seed=0, dtype="float32"))
    mixed = importlib.import_module(f"{backend}_impl.mixed_precision").mixed_precision_loss_and_grads
    want_bf16_loss, want_bf16 = mixed(model, padded_batch(LM))
    model = numpy_impl.build_model(LM, init_params(LM, seed=0, dtype="float64"))
    curve = np.array(numpy_impl.train(model, [padded_batch(LM)], STEPS, schedule(LM)))
    dropout, _ = with_dropout(impl, impl.train)  # the backend's own single device: its own masks
    results = children.results(backend)
    # bf16 (mixed precision): the same loss; the gradients up to bf16's rounding of each replica's own
    # (test_mixed_precision.py's numpy test says why), within the bf16 budget
    assert abs(float(results["bfloat16/loss"]) - want_bf16_loss) / want_bf16_loss <= 1e-5
    error = gradients_error({name: results[f"bfloat16/grad/{name}"] for name in want_bf16}, want_bf16)
    assert 1e-4 < error <= BF16_BUDGET["gradients"], f"{backend} bf16: gradients differ by {error:.2e}"
    for dtype, (want_loss, want_grads) in want.items():
        grads = {name: results[f"{dtype}/grad/{name}"] for name in want_grads}
        assert abs(float(results[f"{dtype}/loss"]) - want_loss) / want_loss <= TOLERANCE[dtype]
        error = gradient_error(grads, want_grads, dtype)
        assert error <= TOLERANCE[dtype], (
            f"{backend} {REPLICAS[backend]} replicas, {dtype}: gradients differ by {error:.2e}"
        )
    error = float(np.max(np.abs(results["curve"] - curve) / curve))
    assert error <= CURVE_TOLERANCE, f"{backend}: loss curves differ by {error:.2e} (> {CURVE_TOLERANCE:.0e})"
    # with dropout: each replica draws the one device's masks and keeps its rows
    np.testing.assert_allclose(results["dropout"], dropout, rtol=TOLERANCE["float64"], err_msg=f"{backend} dropout")
    if backend == "jax":  # the batch really was split: 2 rows on each of 4 devices
        assert int(results["devices"]) == 4 and int(results["rows_per_device"]) == 2


if __name__ == "__main__":
    child(*sys.argv[1:3], *([int(sys.argv[3]), sys.argv[4]] if len(sys.argv) > 3 else []))
