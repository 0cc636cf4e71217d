"""Data-parallel training on a JAX device mesh: the global batch sharded over the mesh's
``data`` axis (``NamedSharding(mesh, P("data"))``), the parameters and Adam's moments
replicated (``P()``), and the same ``nnx.jit`` step as on one device (train.py's ``_update``).

Nothing in the step is written for N devices: XLA's SPMD partitioner (GSPMD) splits the
forward and backward over the batch rows and inserts the all-reduce the replicated gradients
need. The loss is the one cross_entropy of the global batch, so it is already normalised by the
GLOBAL count of non-pad targets (its sum over the rows is a cross-device reduction).

Devices: ``jax.devices()``, or the CPU's when there are fewer accelerators than replicas. A CPU
is simulated as N devices with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set
before JAX is imported (``transformer-ref train --data-parallel N`` does it). Across machines,
call ``jax.distributed.initialize()`` first in every process: ``jax.devices()`` then lists
every machine's devices and the same code shards over all of them.

Dropout: one random stream draws the mask of the whole global batch (jax's partitionable
threefry), so the masks do not depend on N: they are the one device's, from the same seed, as every
backend's replicas draw them (``transformer_run.data_parallel``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_run.data_parallel import batch_size, check_data_parallel
from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.train import train_loop

from .gradients import loss_and_grads
from .layers import seed_dropout
from .optim import Adam
from .train import train_step


def data_parallel_loss_and_grads(
    model,
    batch: Mapping[str, Any],
    data_parallel: int,
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the loss of the global ``batch``, {canonical parameter name: gradient}), computed on a
    mesh of ``data_parallel`` devices: the batch sharded over them, the parameters replicated.
    ``compute_dtype="bfloat16"``: the passes in bf16 (mixed_precision.py)."""
    check_data_parallel(batch_size(model.config, batch), data_parallel)
    check_compute_dtype(compute_dtype)
    mesh = data_parallel_mesh(data_parallel)
    replicate(model, mesh)
    try:
        return loss_and_grads(model, shard_batch(batch, mesh), label_smoothing, compute_dtype)
    finally:
        gather(model)


def data_parallel_train(
    model,
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
    data_parallel: int = 1,
    compute_dtype: str | None = None,
) -> list[float]:
    """``train`` over ``data_parallel`` devices: each step is train.py's ``train_step`` on the
    sharded global batch; the loop is ``transformer_run.train``'s. ``compute_dtype``: as
    ``train``'s (mixed precision)."""
    check_compute_dtype(compute_dtype)
    for batch in batches:
        check_data_parallel(batch_size(model.config, batch), data_parallel)
    optimizer = Adam(model, schedule)
    mesh = data_parallel_mesh(data_parallel)
    replicate(model, mesh)
    replicate(optimizer.optimizer, mesh)  # Adam's moments and counts, like the weights
    sharded = [shard_batch(batch, mesh) for batch in batches]  # placed once, read every pass
    try:
        step = train_step
        if compute_dtype is not None:
            step = functools.partial(train_step, compute_dtype=compute_dtype)
        return train_loop(
            model, optimizer, step, seed_dropout, sharded, steps, label_smoothing, callback, seed
        )
    finally:
        gather(model)


def data_parallel_mesh(data_parallel: int) -> jax.sharding.Mesh:
    """A one-axis mesh ``("data",)`` of ``data_parallel`` devices: the accelerators, else the CPU's
    (simulated ones too). Auto axes: GSPMD decides how the unannotated values are laid out (jax
    0.10's default, Explicit axes, would make every sharding a type the model code must state)."""
    devices = jax.devices()
    if len(devices) < data_parallel:
        devices = jax.devices("cpu")
    if len(devices) < data_parallel:
        raise ValueError(
            f"data_parallel {data_parallel} needs that many devices; JAX sees {len(devices)}: "
            f"on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count={data_parallel} "
            "before importing jax"
        )
    return jax.make_mesh(
        (data_parallel,), ("data",), axis_types=(AxisType.Auto,), devices=devices[:data_parallel]
    )


def shard_batch(batch: Mapping[str, Any], mesh: jax.sharding.Mesh) -> dict:
    """Each array of ``batch`` split by rows over the mesh's ``data`` axis: device r holds
    rank r's rows."""
    rows = NamedSharding(mesh, P("data"))
    return {key: jax.device_put(np.asarray(x), rows) for key, x in batch.items()}


def replicate(module: nnx.Module | nnx.Optimizer, mesh: jax.sharding.Mesh) -> None:
    """Every array of ``module`` (weights, buffers, random streams, Adam's state) copied to
    every device."""
    nnx.update(module, jax.device_put(nnx.state(module), NamedSharding(mesh, P())))


def gather(module: nnx.Module) -> None:
    """Back to one device (the default one), so that the trained model runs like any other."""
    nnx.update(module, jax.device_put(nnx.state(module), jax.devices()[0]))
