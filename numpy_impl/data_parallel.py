"""Data-parallel training, the reference: the global batch split into ``data_parallel`` shards,
run one after the other on the one model, their gradients added up with each shard's loss
weighted by its share of the GLOBAL count of non-pad targets (``transformer_run.data_parallel``).

That sum is the gradient of the single-device loss on the whole batch, which is what
torch_impl's DistributedDataParallel processes and jax_impl's sharded step compute too.
Dropout: every replica draws the one device's masks, of the whole batch, from the one device's
streams, and keeps its rows (sharding.py's ``WholeMaskDropout``), as torch's replicas do: with
dropout too the replicas' step is the single-device step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from transformer_run.data_parallel import (
    batch_size,
    check_data_parallel,
    shard,
    shard_weights,
)
from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.sharding import Plan
from transformer_run.train import train_loop

from .gradients import loss_and_grads
from .layers import seed_dropout
from .optim import Adam
from .sharding import keep_own_parts
from .train import dropout_streams, set_dropout_streams


def data_parallel_loss_and_grads(
    model,
    batch: Mapping[str, np.ndarray],
    data_parallel: int,
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the loss of the global ``batch``, {canonical parameter name: gradient}), computed as
    ``data_parallel`` replicas would: shard by shard, the gradients added up, each shard's
    weighted by its share of the global count of non-pad targets. ``compute_dtype="bfloat16"``:
    each shard's passes in bf16 (mixed_precision.py)."""
    return _replica_sum(model, batch, data_parallel, label_smoothing, compute_dtype)


def data_parallel_train(
    model,
    batches: Sequence[Mapping[str, np.ndarray]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
    data_parallel: int = 1,
    compute_dtype: str | None = None,
) -> list[float]:
    """``train`` over ``data_parallel`` replicas: each step's gradients are those of the global
    batch, summed over its shards; the loop is ``transformer_run.train``'s. ``compute_dtype``:
    as ``train``'s (mixed precision)."""
    check_compute_dtype(compute_dtype)
    for batch in batches:
        check_data_parallel(batch_size(model.config, batch), data_parallel)
    optimizer = Adam(model, schedule)

    def data_parallel_train_step(
        model, optimizer: Adam, batch: Mapping[str, np.ndarray], label_smoothing: float
    ):
        loss, grads = _replica_sum(model, batch, data_parallel, label_smoothing, compute_dtype)
        optimizer.step(grads)
        return loss

    return train_loop(
        model, optimizer, data_parallel_train_step, seed_dropout, batches, steps,
        label_smoothing, callback, seed,
    )  # fmt: skip


def _replica_sum(
    model,
    batch: Mapping[str, np.ndarray],
    data_parallel: int,
    label_smoothing: float,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """What the replicas' all-reduce adds up, one shard after another:
    sum_r weight_r * (loss_r, grads_r), weight_r = count_r / count. Not the mean of the shards'
    means, which weighs a shard full of padding as much as a full one."""
    weights = shard_weights(model.config, batch, data_parallel)
    plan = Plan(data_parallel=data_parallel)
    start = dropout_streams(model)  # where one device's streams stand: each replica starts there
    loss, grads = 0.0, {}
    for rank, weight in enumerate(weights):
        set_dropout_streams(model, start)
        unwrap = keep_own_parts(model, plan, rank)  # replica r's rows of the whole batch's masks
        rows = shard(model.config, batch, rank, data_parallel)  # replica r's rows
        try:
            shard_loss, shard_grads = loss_and_grads(model, rows, label_smoothing, compute_dtype)
        finally:
            unwrap()
        loss += weight * shard_loss
        for name, grad in shard_grads.items():
            # like the weight
            grads[name] = grads[name] + weight * grad if name in grads else weight * grad
    return loss, grads
