"""Data-parallel training with PyTorch's ``DistributedDataParallel``: one process per replica
(gloo on CPU, nccl on GPUs), each running train.py's loop on its rows of the global batch;
DDP all-reduces the gradients during ``backward``.

Launched two ways, the same code:
- by ``data_parallel_train`` itself: ``torch.multiprocessing.spawn`` starts ``data_parallel``
  processes on this machine, which meet through a file (``init_method="file://..."``, no port);
- by ``torchrun`` (one machine or several): the processes already exist, ``RANK`` and
  ``WORLD_SIZE`` are set, and ``data_parallel_train`` runs this process's replica
  (``init_method="env://"``, torchrun's rendezvous).

The loss is normalised by the GLOBAL count of non-pad targets: each process all-reduces its
count, weighs its shard's mean by ``count_r / count``, and multiplies by the number of
replicas, because DDP averages the gradients where the loss needs their sum.

Dropout: each process seeds torch's global generator with the run's seed, as one device does,
draws the one device's mask of the whole batch and keeps its rows (sharding.py's
``WholeMaskDropout``): with dropout too the replicas' step is the single-device step.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from transformer_run.batches import split_batch
from transformer_run.data_parallel import (
    batch_size,
    check_data_parallel,
    rate_table,
    shard,
    table_schedule,
)
from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.sharding import Plan
from transformer_run.train import train_loop
from transformer_spec import param_schema, parent_of

from .layers import seed_dropout
from .loss import cross_entropy
from .mixed_precision import compute_in_bf16
from .optim import Adam
from .params import _to_torch_layout, build_model, to_params

# a replica that never arrives fails the run, not hangs it
START_TIMEOUT = datetime.timedelta(seconds=120)
_TORCHRUN_GROUPS = itertools.count()  # the process groups _run has made under torchrun


def data_parallel_loss_and_grads(
    model,
    batch: Mapping[str, Any],
    data_parallel: int,
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the loss of the global ``batch``, {canonical parameter name: gradient}), computed by
    ``data_parallel`` DDP processes, each on its rows (see ``data_parallel_train`` for which).
    ``compute_dtype="bfloat16"``: each replica's forward under torch.autocast
    (mixed_precision.py)."""
    check_data_parallel(batch_size(model.config, batch), data_parallel)
    check_compute_dtype(compute_dtype)
    return _run(
        _loss_and_grads_replica, model, data_parallel, batch, label_smoothing, compute_dtype
    )


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
    """``train`` over ``data_parallel`` DDP processes: this process's replica when it is one already
    (torchrun started it, or a process group exists), else ``data_parallel`` processes spawned here.
    ``model`` ends with the trained weights either way. Spawned, the callback runs in rank 0's
    process (so it must pickle) and the schedule travels as its table of rates. ``compute_dtype``:
    as ``train``'s (mixed precision)."""
    check_compute_dtype(compute_dtype)
    for batch in batches:
        check_data_parallel(batch_size(model.config, batch), data_parallel)
    rates = rate_table(schedule, steps)
    losses, params = _run(
        _train_replica, model, data_parallel, batches, steps, rates, label_smoothing, callback,
        seed, compute_dtype,
    )  # fmt: skip
    # rank 0's trained weights into this process's model (spawned: it has not seen them)
    with torch.no_grad():
        for name, value in params.items():
            parent, leaf = parent_of(model, name)
            weight = getattr(parent, leaf)
            in_torch_layout = np.ascontiguousarray(_to_torch_layout(parent, leaf, value))
            weight.copy_(torch.as_tensor(in_torch_layout).to(weight.device))
    return losses


def _run(job, model, data_parallel: int, *args) -> Any:
    """``job(model, rank, data_parallel, *args)`` as replica ``rank`` of a process group: the
    one that exists, or one made from torchrun's variables (env://), or ``data_parallel`` new
    processes."""
    if dist.is_initialized():
        if dist.get_world_size() != data_parallel:
            raise ValueError(
                f"data_parallel {data_parallel}, but the process group has {dist.get_world_size()}"
            )
        return job(model, dist.get_rank(), data_parallel, *args)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        device = next(model.parameters()).device
        backend = _process_group_backend(device)
        # torchrun's store outlives each group made here, and a new group's keys are the last
        # one's (its name restarts once the group is gone): the next call's ranks would read the
        # last group's addresses. Each group its own keys, numbered alike on every rank, and
        # apart from those of the job's earlier attempts (torchrun --max-restarts keeps the store)
        store, rank, world = next(dist.rendezvous("env://", timeout=START_TIMEOUT))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"torch_impl-{attempt}-{next(_TORCHRUN_GROUPS)}", store)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=START_TIMEOUT
        )
        try:
            return _run(job, model, data_parallel, *args)
        finally:
            dist.destroy_process_group()
    return _spawn(job, model, data_parallel, *args)


def data_parallel_train_step(
    model: DistributedDataParallel,
    optimizer: Adam,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    rank: int = 0,
    data_parallel: int = 1,
    compute_dtype: str | None = None,
) -> float:
    """One update of replica ``rank`` on its rows of the global ``batch``; returns the global
    loss."""
    config, device = model.module.config, next(model.parameters()).device
    inputs, targets = split_batch(config, shard(config, batch, rank, data_parallel))
    targets = torch.as_tensor(targets, device=device)  # (B / N, T)
    count = (targets != config.pad_id).sum()  # (): this replica's non-pad targets
    total = count.clone()
    dist.all_reduce(total)  # (): every replica's, the loss's denominator
    with torch.enable_grad():
        with (
            compute_in_bf16(model.module) if compute_dtype is not None else contextlib.nullcontext()
        ):
            # (B / N, T, V)
            logits = model(*(torch.as_tensor(x, device=device) for x in inputs)).logits
        if compute_dtype is not None:
            logits = logits.float()  # the loss in float32
        mean = cross_entropy(logits, targets, config.pad_id, label_smoothing)  # (): over its rows
        share = mean * count / total.clamp(min=1)  # ()
        # DDP averages the replicas' gradients: * N makes that their sum
        (share * data_parallel).backward()
    optimizer.step()
    loss = share.detach().clone()  # ()
    dist.all_reduce(loss)  # (): the global batch's loss, the sum of the shares
    return float(loss)


def _train_replica(
    model,
    rank,
    data_parallel,
    batches,
    steps,
    rates,
    label_smoothing,
    callback,
    seed,
    compute_dtype=None,
) -> tuple[list[float], dict[str, np.ndarray]]:
    from .sharding import keep_own_parts  # here: sharding.py imports this file

    keep_own_parts(model, Plan(data_parallel=data_parallel), rank)  # its rows of one device's masks
    # broadcasts rank 0's weights: every replica starts equal
    replica = DistributedDataParallel(model)
    optimizer = Adam(model, functools.partial(table_schedule, rates))
    step = functools.partial(
        data_parallel_train_step,
        rank=rank,
        data_parallel=data_parallel,
        compute_dtype=compute_dtype,
    )
    losses = train_loop(replica, optimizer, step, seed_dropout, batches, steps, label_smoothing,
                        callback if rank == 0 else None, seed)  # fmt: skip
    return losses, to_params(model)  # NumPy arrays, on the host


def _loss_and_grads_replica(model, rank, data_parallel, batch, label_smoothing, compute_dtype=None):
    """One DDP backward on this replica's rows; the all-reduced gradients, read from ``.grad``."""
    replica = DistributedDataParallel(model)
    config, device = model.config, next(model.parameters()).device
    inputs, targets = split_batch(config, shard(config, batch, rank, data_parallel))
    targets = torch.as_tensor(targets, device=device)
    count = (targets != config.pad_id).sum()
    total = count.clone()
    dist.all_reduce(total)
    with compute_in_bf16(model) if compute_dtype is not None else contextlib.nullcontext():
        logits = replica(*(torch.as_tensor(x, device=device) for x in inputs)).logits
    if compute_dtype is not None:
        logits = logits.float()  # the loss in float32
    mean = cross_entropy(logits, targets, config.pad_id, label_smoothing)
    share = mean * count / total.clamp(min=1)
    (share * data_parallel).backward()
    loss = share.detach().clone()
    dist.all_reduce(loss)
    grads = {}
    for name in param_schema(config):
        parent, leaf = parent_of(model, name)
        grad = getattr(parent, leaf).grad.detach().cpu().numpy()  # torch's layout
        grads[name] = np.array(_to_torch_layout(parent, leaf, grad))
    model.zero_grad(set_to_none=True)  # leave the model as it came
    return float(loss), grads


def _process_group_backend(device: torch.device) -> str:
    """nccl between GPUs, gloo between CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"


def _spawn(job, model, data_parallel: int, *args) -> Any:
    """Run ``job(model, rank, data_parallel, *args)`` in ``data_parallel`` new processes joined
    in one process group; return rank 0's result. A process that fails fails the call with its
    traceback (``torch.multiprocessing.ProcessRaisedException``) or its signal
    (``ProcessExitedException``)."""
    with tempfile.TemporaryDirectory(prefix="ddp-") as folder:
        init_file = os.path.join(folder, "rendezvous")
        result_file = os.path.join(folder, "result.pkl")
        params = {name: np.asarray(value) for name, value in to_params(model).items()}
        threads = os.environ.get("OMP_NUM_THREADS")
        # one core per replica, set before the children import torch
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            mp.spawn(
                _replica,
                args=(job, model.config, params, data_parallel, init_file, result_file, args),
                nprocs=data_parallel,
                join=True,
            )
        finally:
            if threads is None:
                os.environ.pop("OMP_NUM_THREADS")
            else:
                os.environ["OMP_NUM_THREADS"] = threads
        with open(result_file, "rb") as file:
            return pickle.load(file)


def _replica(rank, job, config, params, data_parallel, init_file, result_file, args):
    """A spawned process: join the group, rebuild the model from the weights sent, run ``job``."""
    torch.set_num_threads(1)
    # one GPU per process where there are enough, else the CPU
    device = torch.device(f"cuda:{rank}" if torch.cuda.device_count() >= data_parallel else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # nccl's own work (a barrier) on this GPU, not GPU 0
    dist.init_process_group(
        _process_group_backend(device),
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=data_parallel,
        timeout=START_TIMEOUT,
    )
    try:
        result = job(build_model(config, params).to(device), rank, data_parallel, *args)
        if rank == 0:
            with open(result_file, "wb") as file:
                pickle.dump(result, file)
        dist.barrier()  # no replica tears the group down while another still uses it
    finally:
        dist.destroy_process_group()
    # Done, and the result is on disk: leave without the interpreter's teardown, which costs
    # ~1.5 s per process with torch loaded and runs the C++ destructors of gloo's threads.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
