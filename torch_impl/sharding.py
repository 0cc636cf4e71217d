"""Sharded training with torch.distributed: FSDP (``fully_shard``), tensor parallel
(``parallelize_module``) and data parallel, alone or together on a 2-D ``DeviceMesh``.

The plan, and which weight is split how, are ``transformer_run.sharding``'s; here torch's engines
carry it out, one process per device (gloo on CPU, nccl on GPUs), on a mesh of
``(data, model)`` = ``(data_parallel * fsdp, tensor_parallel)`` ranks:

- along ``model`` (Megatron): ``parallelize_module`` splits each column-split matrix (w_q, w_k, w_v,
  w_1 or w_gate and w_up) by output features (``ColwiseParallel``) and each row-split one (w_o, w_2
  or w_down) by input features (``RowwiseParallel``, whose partial outputs one all-reduce adds up);
  ``BlockInput`` makes each block's input one DTensor, so that the backward adds the column-split
  matrices' parts of its gradient and all-reduces them once (Megatron's "f").
  A rank's attention sees ``num_heads / K`` query heads and ``num_kv_heads / K`` key/value heads:
  ``split_heads`` reshapes to ``-1`` heads, so the layer's code runs unchanged on its own heads.
- along ``data``: each rank takes its rows of the global batch. FSDP (``fully_shard`` on each
  layer, then on the whole model) keeps 1/N of every weight, its gradient and its Adam moments on
  each rank, all-gathers a layer's weights just before it runs (forward and backward) and
  reduce-scatters its gradients; data parallel (``replicate``) keeps whole copies and all-reduces
  the gradients.

The loss is normalised by the GLOBAL count of non-pad targets, as data_parallel.py does: each data
rank weighs its rows' mean by ``count_r / count`` and multiplies by the number of data ranks,
because both engines average the gradients where the loss needs their sum.

Launched like data_parallel.py: by ``sharded_train`` itself (``torch.multiprocessing.spawn``, the
processes meeting through a file), or under ``torchrun`` with one process per device.

Dropout: every process seeds torch's global generator with the run's seed, as one device does,
draws the one device's mask of the whole activation and keeps its own part (``WholeMaskDropout``):
its rows of the batch, and inside a tensor-parallel block its heads of the attention weights or its
hidden features of the feed-forward; where the activation is whole on every device of ``model``
(the embeddings' and each sub-layer's output), the whole width of its rows. So a sharded run with
dropout is the single-device run with the same seed, and the generator (a checkpoint's streams)
advances as one device's does. The price: each device draws the random numbers of every device
that shares the activation, N times its own part along an axis split N ways.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_run import sharded_checkpoint
from transformer_run.batches import split_batch
from transformer_run.data_parallel import batch_size, rate_table, shard, table_schedule
from transformer_run.faults import maybe_fail
from transformer_run.sharded_checkpoint import ShardedCheckpoint
from transformer_run.sharding import COLUMN, ROW, Plan, check_plan, plan_weights
from transformer_run.train import TrainingState, train_loop
from transformer_spec import param_schema, parent_of

from . import sharded_checkpoint as torch_checkpoint
from .attention import MultiHeadAttention
from .data_parallel import _run
from .feed_forward import GatedFeedForward, PositionwiseFeedForward
from .kernels import fused_kernels
from .layers import Dropout, seed_dropout
from .loss import cross_entropy
from .optim import Adam
from .params import _to_torch_layout
from .train import dropout_streams, set_dropout_streams


def sharding_mesh(plan: Plan, device_type: str = "cpu") -> DeviceMesh:
    """The 2-D mesh ``(data, model)`` of this process group (rank = data_rank * K + model_rank)."""
    return init_device_mesh(
        device_type, (plan.data, plan.tensor_parallel), mesh_dim_names=("data", "model")
    )


def shard_model(model, mesh: DeviceMesh, plan: Plan):
    """Split ``model``'s weights over ``mesh`` in place, as ``plan`` says: tensor parallel along
    ``model``, then FSDP or data parallel along ``data``. Returns ``model``."""
    if plan.tensor_parallel > 1:
        parallelize_module(model, mesh["model"], tensor_parallel_plan(model.config, plan))
    if plan.fsdp > 1:
        weights = plan_weights(model.config, plan)
        place = functools.partial(_fsdp_dim, _parameter_names(model), weights)
        for layer in _layers(model):  # each gathers its weights just before it runs
            fully_shard(layer, mesh=mesh["data"], shard_placement_fn=place)
        fully_shard(model, mesh=mesh["data"], shard_placement_fn=place)  # embeddings, norms, output
    elif plan.data_parallel > 1:
        # FSDP2's data parallel: whole copies, its gradients all-reduced (DTensor-aware, so it
        # composes with tensor parallel, where DistributedDataParallel does not)
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for layer in _layers(model):  # each layer's gradients all-reduced as soon as they are done
            replicate(layer, mesh=mesh["data"])
        replicate(model, mesh=mesh["data"])
    return model


def tensor_parallel_plan(config, plan: Plan) -> dict[str, ParallelStyle]:
    """{module path: its style}: the plan's split of each weight (``ColwiseParallel`` or
    ``RowwiseParallel`` on the Linear holding it), and ``BlockInput`` on each block that holds a
    column-split Linear (its attention blocks and feed-forward)."""
    styles = {}
    for name, where in plan_weights(config, plan).items():
        path = name.rsplit(".", 1)[0]  # the Linear holding the weight (and its bias)
        if where.tensor_parallel == COLUMN:
            styles[path] = ColwiseParallel()
            block = path.rsplit(".", 1)[0]  # the attention block, or the feed-forward
            styles.setdefault(block, BlockInput(3 if block.endswith("attn") else 1))
        elif where.tensor_parallel == ROW:
            styles[path] = RowwiseParallel()
    return styles


class BlockInput(ParallelStyle):
    """Megatron's "f" at the entrance of a block: each distinct tensor among the block's first
    ``count`` inputs (attention's query, key and value; the feed-forward's x) becomes one
    replicated DTensor, which every column-split Linear of the block then reads.

    Identity in the forward. In the backward the Linears' parts of that input's gradient (one per
    Linear: q, k and v in a self-attention) are added on each rank, still partial, and the sum is
    all-reduced once, where ``ColwiseParallel`` alone would make each Linear's input a DTensor of
    its own and all-reduce each part: one all-reduce per distinct input, not per projection."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        def replicated(module, args):
            made: dict[int, DTensor] = {}  # id(tensor) -> its DTensor: the same tensor, once

            def once(x):
                if not isinstance(x, torch.Tensor) or isinstance(x, DTensor):
                    return x
                if id(x) not in made:
                    made[id(x)] = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                return made[id(x)]

            return tuple(once(x) for x in args[: self.count]) + tuple(args[self.count :])

        module.register_forward_pre_hook(replicated)
        return module


class WholeMaskDropout(torch.nn.Module):
    """A Dropout, wrapped from outside, on one device of a plan (this process): it draws the mask
    of the whole activation, every device's part of it, from torch's generator (seeded as the one
    device's, where the one device's stands) and keeps this device's part, so a sharded step drops
    what one device drops. ``parts``: (axis, devices along it, this device's index) for each way the
    activation is split: the data rank's rows (axis 0), and inside a tensor-parallel block the
    model rank's heads of the attention weights (axis 1) or hidden features of the feed-forward
    (axis -1); where the activation is whole on every model rank (the embeddings' and each
    sub-layer's output) the rows alone. Each device draws every device's random numbers."""

    def __init__(self, dropout: Dropout, parts: tuple[tuple[int, int, int], ...]):
        super().__init__()
        self.dropout, self.parts = dropout, parts
        self.training = dropout.training  # as model.train() and model.eval() set both

    @property
    def rate(self) -> float:  # read by the fused kernels, which run only without dropout
        return self.dropout.rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dropout.training or self.rate == 0:
            return self.dropout(x)  # nothing dropped
        whole = list(x.shape)
        for axis, devices, _ in self.parts:
            whole[axis] *= devices  # the activation on one device
        # the one device's mask, as Dropout draws it: F.dropout of ones is its multiplier, 0 or
        # 1 / (1 - rate), drawn as F.dropout draws one for an activation of that shape
        ones = torch.ones(whole, dtype=x.dtype, device=x.device)
        multiplier = F.dropout(ones, self.rate)  # (...): the whole activation's
        for axis, devices, index in self.parts:
            multiplier = multiplier.chunk(devices, axis)[index]  # (...,) like x: this device's part
        return x * multiplier  # (...,) like x


def keep_own_parts(model, plan: Plan, data_rank: int, model_rank: int = 0) -> None:
    """Each Dropout of device (``data_rank``, ``model_rank``)'s ``model`` a ``WholeMaskDropout``
    that keeps its part of the one device's mask: its data rank's rows, and inside an attention
    block or a feed-forward its model rank's heads or hidden features (under tensor parallel)."""
    rows = ((0, plan.data, data_rank),)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, Dropout):
                continue
            parts = rows
            blocks = (MultiHeadAttention, PositionwiseFeedForward, GatedFeedForward)
            if plan.tensor_parallel > 1 and isinstance(module, blocks):
                # (B, H, T_q, T_k): its heads; (B, T, d_ff): its hidden features
                axis = 1 if isinstance(module, MultiHeadAttention) else -1
                parts = (*rows, (axis, plan.tensor_parallel, model_rank))
            setattr(module, name, WholeMaskDropout(child, parts))


def _parameter_names(model) -> dict[int, str]:
    """{id(parameter): its canonical name}."""
    names = {}
    for name in param_schema(model.config, model.schema):
        parent, leaf = parent_of(model, name)
        names[id(getattr(parent, leaf))] = name
    return names


def _fsdp_dim(names: dict[int, str], weights: dict, parameter) -> Shard:
    """The dimension FSDP splits of ``parameter``: the plan's, in torch's layout (nn.Linear stores
    its weight [out, in], the transpose of the plan's [in, out])."""
    name = names[id(parameter)]
    dim = weights[name].fsdp_dim
    transposed = name.endswith(".weight") and name.rsplit(".", 2)[-2].startswith("w_")
    return Shard(1 - dim if transposed and parameter.ndim == 2 else dim)


def _device(model) -> torch.device:
    """Where the model's weights are (the CPU, or this process's GPU)."""
    return next(model.parameters()).device


def _layers(model) -> list[torch.nn.Module]:
    """The encoder's and the decoder's layers, in order."""
    stacks = [getattr(model, name, None) for name in ("encoder", "decoder")]
    return [layer for stack in stacks if stack is not None for layer in stack.layers]


def sharded_train_step(
    model, optimizer: Adam, batch: Mapping[str, Any], label_smoothing: float = 0.0, *, mesh
) -> float:
    """One update of this rank, on its data rank's rows of the global ``batch``; returns the global
    batch's loss."""
    loss = sharded_backward(model, batch, label_smoothing, mesh)
    maybe_fail("step", optimizer.t + 1, dist.get_rank())  # a rank planned to die here does
    optimizer.step()
    return loss


def sharded_backward(model, batch: Mapping[str, Any], label_smoothing: float, mesh) -> float:
    """This rank's share of the loss, backward: the gradients, summed over the data ranks by the
    engine, in ``.grad`` (this rank's pieces). Returns the global batch's loss."""
    config, device = model.config, _device(model)
    data = mesh["data"]
    inputs, targets = split_batch(config, shard(config, batch, data.get_local_rank(), data.size()))
    targets = torch.as_tensor(targets, device=device)  # (B / N, T)
    count = (targets != config.pad_id).sum()  # (): this data rank's non-pad targets
    total = _sum_over(data, count.clone())  # (): every data rank's, the loss's denominator
    # a fused kernel reads w_q, w_k and w_v as one packed matrix, past the hooks that split them:
    # under tensor parallel the written-out layers run
    split = mesh["model"].size() > 1
    with torch.enable_grad(), fused_kernels(False) if split else contextlib.nullcontext():
        with warnings.catch_warnings():
            # FSDP warns that the model's output holds views (its hidden states): none is changed
            # in place here, which is what the warning is about
            warnings.filterwarnings("ignore", "FSDP2-wrapped module", UserWarning)
            inputs = tuple(torch.as_tensor(x, device=device) for x in inputs)
            logits = model(*inputs).logits  # (B / N, T, V)
        mean = cross_entropy(logits, targets, config.pad_id, label_smoothing)  # (): its rows
        share = mean * count / total.clamp(min=1)  # ()
        # the engines average the data ranks' gradients: * N makes that their sum
        (share * data.size()).backward()
    return float(_sum_over(data, share.detach().clone()))  # the global loss, the shares' sum


def _sum_over(axis: DeviceMesh, value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over the ranks of ``axis`` (no collective where it has one rank)."""
    if axis.size() > 1:
        dist.all_reduce(value, group=axis.get_group())
    return value


def whole(model, tensors: str = "weights", optimizer: Adam | None = None) -> dict[str, np.ndarray]:
    """Every weight (``tensors="weights"``), gradient (``"grads"``) or Adam moment (``"m"``,
    ``"v"``) whole, under its canonical name and layout, as NumPy arrays. A sharded one is gathered
    from its ranks first (``full_tensor``, a collective: every rank calls this)."""
    out = {}
    for name in param_schema(model.config, model.schema):
        parent, leaf = parent_of(model, name)
        value = getattr(parent, leaf)
        if tensors == "grads":
            value = value.grad
        elif tensors in ("m", "v"):
            value = optimizer.optimizer.state[value]["exp_avg" if tensors == "m" else "exp_avg_sq"]
        if isinstance(value, DTensor):
            with _quiet(_REDISTRIBUTE_LOG):
                value = value.full_tensor()
        value = value.detach().cpu().numpy()  # torch's layout
        out[name] = np.array(_to_torch_layout(parent, leaf, value))
    return out


# DTensor logs a warning for each bias that FSDP splits on top of tensor parallel (the same
# dimension twice) when it is gathered whole: two all-gathers instead of one, as the plan expects
_REDISTRIBUTE_LOG = "torch.distributed.tensor._redistribute"


@contextlib.contextmanager
def _quiet(logger_name: str):
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


COLLECTIVE_KINDS = {  # the ops torch's engines run, by the kinds of transformer_run.sharding
    "all_gather_into_tensor": "all-gather",  # DTensor's (functional collectives)
    "all_gather_into_tensor_coalesced": "all-gather",
    "_allgather_base_": "all-gather",  # torch.distributed's (c10d), FSDP's
    "allgather_": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "all_reduce": "all-reduce",
    "all_reduce_coalesced": "all-reduce",
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
}

# functional collectives' bookkeeping: waiting for one to finish, wrapping its result for autograd
NOT_COMMUNICATION = ("wait_tensor", "_wrap_tensor_autograd")


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives this process runs while it is on, by kind, with the bytes of the
    whole buffer each works on (an all-gather's output, a reduce-scatter's input): every one of
    torch's engines reaches the dispatcher as a ``c10d`` or ``_c10d_functional`` op."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, name = func.namespace, func._schema.name.split("::")[-1]
        if namespace in ("c10d", "_c10d_functional") and name not in NOT_COMMUNICATION:
            kind = COLLECTIVE_KINDS.get(name, name)
            entry = self.counts.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += _whole_buffer_bytes(namespace, kind, args)
        return func(*args, **(kwargs or {}))


def _whole_buffer_bytes(namespace: str, kind: str, args) -> int:
    """The bytes a collective's whole buffer holds, from the op's arguments: c10d's ops take
    (outputs, inputs, ...); the functional ones (input, ...), an all-gather's with the group's
    size."""
    if namespace == "_c10d_functional":
        return _nbytes(args[0]) * (args[1] if kind == "all-gather" else 1)
    return _nbytes(args[1] if kind == "reduce-scatter" else args[0])


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_nbytes(t) for t in tensors)  # a list (of lists) of tensors


# ------------------------------------------------------------------------------ entry points
def sharded_loss_and_grads(
    model, batch: Mapping[str, Any], plan: Plan, label_smoothing: float = 0.0
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the loss of the global ``batch``, {canonical name: whole gradient}) from one backward
    over ``plan``'s devices."""
    _check_devices(model, batch, plan)
    return _run(_loss_and_grads_rank, model, plan.devices, plan, batch, label_smoothing)


def sharded_logits(model, batch: Mapping[str, Any], plan: Plan) -> np.ndarray:
    """The forward of the global ``batch`` over ``plan``'s devices: its logits (B, T, V), each data
    rank's rows all-gathered in order."""
    _check_devices(model, batch, plan)
    return _run(_logits_rank, model, plan.devices, plan, batch)


def step_collectives(
    model, batch: Mapping[str, Any], plan: Plan, label_smoothing: float = 0.0
) -> dict[str, dict[str, int]]:
    """The collectives device 0 runs in one training step (backward and Adam's update), counted
    at torch's dispatcher (``CollectiveCounter``): {kind: {"count": n, "bytes": b}}."""
    _check_devices(model, batch, plan)
    return _run(_collectives_rank, model, plan.devices, plan, batch, label_smoothing)


def step_memory(
    model, batch: Mapping[str, Any], plan: Plan, label_smoothing: float = 0.0
) -> dict[str, int]:
    """The bytes the fullest rank holds at its peak during one FSDP training step (backward and
    Adam's update, after a first step has made the moments), measured by torch's own tracker of
    FSDP2's memory (``FSDPMemTracker``, which follows every tensor the step creates and frees at
    the dispatcher): ``weights`` (its pieces, and a layer gathered whole), ``gradients``, ``adam``
    (the moments), ``communication`` (the all-gather's and reduce-scatter's buffers),
    ``activations``, ``other`` (temporaries, buffers, the inputs) and ``total``."""
    _check_devices(model, batch, plan)
    if plan.fsdp == 1:
        raise ValueError(f"step_memory measures an FSDP step; the plan has fsdp {plan.fsdp}")
    return _run(_memory_rank, model, plan.devices, plan, batch, label_smoothing)


MEMORY_KINDS = {  # FSDPMemTracker's categories, by what they hold
    "Sharded Param": "weights", "Unsharded Param": "weights", "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients", "OptState": "adam", "All Gather": "communication",
    "Reduce Scatter": "communication", "Activation": "activations",
}  # fmt: skip


def sharded_train(
    model,
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
    *,
    plan: Plan,
    checkpoint: Callable[[TrainingState], None] | None = None,
    checkpoint_every: int = 0,
    checkpoint_dir: str | None = None,
    resume: ShardedCheckpoint | TrainingState | None = None,
    run_record: dict[str, Any] | None = None,
) -> list[float]:
    """``train`` with the weights, gradients and Adam's moments spread over ``plan``'s devices:
    this process's rank when it is one already (torchrun started it, or a process group exists),
    else ``plan.devices`` processes spawned here. ``model`` ends with the trained weights, whole.
    ``checkpoint(state)`` receives whole moments under the canonical names; spawned, the states
    come back to this process, which calls it once the run is over (a closure does not pickle).

    ``checkpoint_dir``: a sharded checkpoint there at the same steps (each rank writes its own
    shards with ``torch.distributed.checkpoint``; ``transformer_run.sharded_checkpoint``), with
    ``run_record`` in its training.json. ``resume``: a torch sharded checkpoint saved under any plan
    (``sharded_checkpoint.read``): the run goes on from its step, each rank reading its shards of
    this plan from it. Or a whole ``TrainingState`` (a checkpoint file's, any backend's) whose
    weights ``model`` holds already."""
    if isinstance(resume, ShardedCheckpoint) and resume.framework != "torch":
        raise ValueError(
            f"{resume.folder!r} is a {resume.framework} checkpoint: consolidate it into one file "
            "(transformer-ref checkpoint consolidate) to continue it in torch"
        )
    for batch in batches:
        _check_devices(model, batch, plan)
    rates = rate_table(schedule, steps)
    spawned = not dist.is_initialized() and "RANK" not in os.environ
    keep = checkpoint is not None and spawned
    losses, params, states = _run(
        _train_rank, model, plan.devices, plan, batches, steps, rates, label_smoothing, callback,
        seed, None if spawned else checkpoint, checkpoint_every, keep, checkpoint_dir, resume,
        run_record,
    )  # fmt: skip
    for state, weights in states:  # spawned: saved here, in order, each with its step's weights
        load_whole(model, weights)
        checkpoint(state)
    load_whole(model, params)
    return losses


def load_whole(model, params: Mapping[str, np.ndarray]) -> None:
    """Write whole weights (canonical names and layout) into ``model``'s own tensors."""
    with torch.no_grad():
        for name, value in params.items():
            parent, leaf = parent_of(model, name)
            weight = getattr(parent, leaf)
            in_torch_layout = np.ascontiguousarray(_to_torch_layout(parent, leaf, value))
            weight.copy_(torch.as_tensor(in_torch_layout).to(weight.device))


def _check_devices(model, batch: Mapping[str, Any], plan: Plan) -> None:
    """The plan against the model, the batch and, when processes exist already (torchrun, or a
    process group), their number: one line naming both numbers."""
    world = dist.get_world_size() if dist.is_initialized() else os.environ.get("WORLD_SIZE")
    devices = int(world) if world is not None else None
    check_plan(model.config, plan, batch_size(model.config, batch), devices)


# ------------------------------------------------------------------------------ in each process
def _setup(model, plan: Plan):
    """A copy of ``model`` sharded over this rank's mesh (``model`` itself stays whole), its
    Dropouts keeping this rank's part of the one device's masks."""
    mesh = sharding_mesh(plan, _device(model).type)
    local = copy.deepcopy(model)
    keep_own_parts(local, plan, mesh["data"].get_local_rank(), mesh["model"].get_local_rank())
    return shard_model(local, mesh, plan), mesh


def _loss_and_grads_rank(model, rank, devices, plan, batch, label_smoothing):
    sharded, mesh = _setup(model, plan)
    loss = sharded_backward(sharded, batch, label_smoothing, mesh)
    return loss, whole(sharded, "grads")


def _logits_rank(model, rank, devices, plan, batch):
    sharded, mesh = _setup(model, plan)
    config, data = model.config, mesh["data"]
    inputs, _ = split_batch(config, shard(config, batch, data.get_local_rank(), data.size()))
    split = mesh["model"].size() > 1  # the written-out layers, as in sharded_backward
    with torch.no_grad(), fused_kernels(False) if split else contextlib.nullcontext():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "FSDP2-wrapped module", UserWarning)
            inputs = tuple(torch.as_tensor(x, device=_device(model)) for x in inputs)
            logits = sharded(*inputs).logits.contiguous()  # (B / N, T, V), on each model rank
    rows = [logits]
    if data.size() > 1:
        rows = [torch.empty_like(logits) for _ in range(data.size())]
        dist.all_gather(rows, logits, group=data.get_group())
    return torch.cat(rows).cpu().numpy()  # (B, T, V)


def _collectives_rank(model, rank, devices, plan, batch, label_smoothing):
    sharded, mesh = _setup(model, plan)
    optimizer = Adam(sharded, lambda t: 1e-3)
    with CollectiveCounter() as counter:
        sharded_train_step(sharded, optimizer, batch, label_smoothing, mesh=mesh)
    return counter.counts


def _memory_rank(model, rank, devices, plan, batch, label_smoothing):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # torch's, not public

    sharded, mesh = _setup(model, plan)
    optimizer = Adam(sharded, lambda t: 1e-3)
    sharded_train_step(sharded, optimizer, batch, label_smoothing, mesh=mesh)  # the moments exist
    tracker = FSDPMemTracker(sharded, optimizer.optimizer)
    with tracker:
        sharded_train_step(sharded, optimizer, batch, label_smoothing, mesh=mesh)
    peak = tracker.get_tracker_snapshot("peak")[_device(sharded)]  # {category: bytes}
    kinds = ("weights", "gradients", "adam", "communication", "activations", "other", "total")
    held = dict.fromkeys(kinds, 0)
    for category, size in peak.items():
        name = getattr(category, "value", category)  # a category, or the string "Total"
        if name != "Total":
            held[MEMORY_KINDS.get(name, "other")] += size
    held["total"] = sum(held.values())
    # the fullest rank's: each rank's total, the largest, and that rank's breakdown (on the
    # weights' device: nccl moves only GPU tensors)
    device = _device(sharded)
    totals = [torch.zeros((), dtype=torch.int64, device=device) for _ in range(devices)]
    dist.all_gather(totals, torch.tensor(held["total"], device=device))
    fullest = int(torch.stack(totals).argmax())
    breakdown = torch.tensor([held[kind] for kind in kinds], device=device)
    dist.broadcast(breakdown, src=fullest)
    return dict(zip(kinds, (int(b) for b in breakdown), strict=True))


def _train_rank(model, rank, devices, plan, batches, steps, rates, label_smoothing, callback, seed,
                checkpoint, checkpoint_every, keep_states, checkpoint_dir, resume,
                run_record):  # fmt: skip
    sharded, mesh = _setup(model, plan)
    optimizer = Adam(sharded, functools.partial(table_schedule, rates))
    states = []  # spawned: (state, whole weights) for the caller's process to save

    def whole_state(sharded, optimizer: Adam, losses: list[float]) -> TrainingState:
        """Gathered on every rank: the whole weights into ``model``, the whole moments."""
        load_whole(model, whole(sharded))
        moments = {f"m.{n}": m for n, m in whole(sharded, "m", optimizer).items()}
        moments |= {f"v.{n}": v for n, v in whole(sharded, "v", optimizer).items()}
        # torch's generator: every rank drew the one device's masks, so it stands where one
        # device's would after the same steps
        return TrainingState(optimizer.t, list(losses), moments, dropout_streams(model))

    def state_of(sharded, optimizer: Adam, losses: list[float]) -> TrainingState:
        """Nothing gathered: the moments stay in the ranks (whole only for ``checkpoint``)."""
        return TrainingState(optimizer.t, list(losses), {}, dropout_streams(sharded))

    def save(state: TrainingState) -> None:
        if checkpoint_dir is not None:  # every rank its shards; rank 0 commits once all have
            if rank == 0:
                sharded_checkpoint.staging(checkpoint_dir, state.step)
            dist.barrier()
            torch_checkpoint.save(sharded_checkpoint.partial_folder(checkpoint_dir, state.step),
                                  sharded, optimizer)  # fmt: skip
            maybe_fail("save", state.step, rank)  # written, not committed
            dist.barrier()
            if rank == 0:
                config, record = model.config, run_record or {}
                sharded_checkpoint.commit(checkpoint_dir, "torch", config, plan, state, record)
        if checkpoint is None and not keep_states:
            return
        state = whole_state(sharded, optimizer, state.losses)  # a collective: every rank
        if rank == 0 and keep_states:
            states.append((state, whole(model)))
        elif rank == 0:
            checkpoint(state)  # reads the whole weights from ``model``

    def restore(sharded, optimizer: Adam, state: TrainingState) -> None:
        if isinstance(resume, ShardedCheckpoint):
            torch_checkpoint.restore(resume, sharded, optimizer)
        else:
            torch_checkpoint.restore_moments(state, sharded, optimizer)
        if sharded.config.dropout > 0:  # without dropout no stream is read (nor need be torch's)
            set_dropout_streams(sharded, state.dropout)

    step = functools.partial(sharded_train_step, mesh=mesh)
    saving = checkpoint is not None or keep_states or checkpoint_dir is not None
    losses = train_loop(sharded, optimizer, step, seed_dropout, batches, steps, label_smoothing,
                        callback if rank == 0 else None, seed,
                        resume.state if isinstance(resume, ShardedCheckpoint) else resume,
                        save if saving else None, checkpoint_every, state_of, restore)  # fmt: skip
    return losses, whole(sharded), states
