"""Sharded training, the reference: every device of a plan (``transformer_run.sharding``)
simulated in this one process, and every communication between them written out as a NumPy
function over the list of the devices' arrays, counted.

The three collectives the engines run (torch.distributed's, and those XLA puts into a JAX program):

    all_gather([a_0, .., a_{N-1}])      every rank gets a_0 | a_1 | .. | a_{N-1}
    reduce_scatter([g_0, .., g_{N-1}])  rank r gets its 1/N slice of g_0 + .. + g_{N-1}
    all_reduce([g_0, .., g_{N-1}])      every rank gets g_0 + .. + g_{N-1}

A training step on a (data, model) mesh:

- Each data rank (a Python thread here, as each is a process in torch) takes its rows of the
  batch; the ranks all-reduce their count of non-pad targets, so that each weighs its rows' mean
  loss by its share of the global count (data_parallel.py).
- FSDP: before a unit (a layer; the rest of the model, once for the whole step) runs, each device
  copies its pieces of the unit's weights into one flat buffer and the data ranks all-gather them;
  the whole weights are dropped after the layer's forward, all-gathered again for its backward,
  and its gradients, one flat buffer per device, are reduce-scattered: each device keeps the sum
  of its own slice. Data parallel instead keeps the weights whole and all-reduces the gradients.
- Tensor parallel (Megatron): inside each attention and feed-forward block, the model ranks
  compute their own heads (or d_ff slice) from the same input; one all-reduce adds their partial
  outputs after the row-split matmul, and in the backward one all-reduce adds their parts of the
  input's gradient: one per distinct input (self-attention's x, read by w_q, w_k and w_v; in
  cross-attention the query's and the memory's, which w_k and w_v both read). The K
  model ranks of a data rank run in turn inside its thread.
- Adam: each device updates its own pieces with its own pieces of the gradient and of the moments.
  Adam works element by element, so that is the whole update, sliced.
- Dropout: every device draws the one device's mask of the whole activation, from its copy of the
  one device's stream (where the one device's stands), and keeps its own part
  (``WholeMaskDropout``): its rows of the batch, and inside a tensor-parallel block its heads of
  the attention weights or its hidden features of the feed-forward; where the activation is whole
  on every model rank (the embeddings' and each sub-layer's output), the whole width of its rows.
  So a sharded run with dropout is the single-device run with the same seed, and a checkpoint's
  streams are one device's. The price: each device draws the random numbers of every device that
  shares the activation (``step_dropout_draws`` counts them).

``step_collectives`` counts what device 0 runs in one step: the reference the engines' counts
are compared with. Each ``Device`` records the bytes it holds (its pieces of the weights, the
gradients and Adam's moments, plus whatever whole weights or gradients it holds for a while) and
its peak.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy import ndarray as Array

from transformer_run import sharded_checkpoint
from transformer_run.batches import split_batch
from transformer_run.data_parallel import batch_size, shard, token_count
from transformer_run.faults import LostDeviceError, maybe_fail
from transformer_run.sharded_checkpoint import ShardedCheckpoint
from transformer_run.sharding import (
    COLUMN,
    ROW,
    Placement,
    Plan,
    check_plan,
    fsdp_units,
    join,
    piece,
    plan_weights,
)
from transformer_run.train import TrainingState, train_loop
from transformer_spec import param_schema, parent_of

from . import sharded_checkpoint as numpy_checkpoint
from .attention import MultiHeadAttention
from .checks import weights_dtype
from .feed_forward import GatedFeedForward, PositionwiseFeedForward, make_feed_forward
from .layers import Dropout, Linear, seed_dropout
from .loss import cross_entropy, cross_entropy_backward
from .module import Module, enable_grad, named_submodules, with_prefix
from .params import build_model, to_params
from .positional import RotaryEmbedding
from .train import dropout_streams, set_dropout_streams


# --------------------------------------------------------------------------- the collectives
def all_gather(buffers: list[Array]) -> list[Array]:
    """[a_0, .., a_{N-1}] (n,) each -> every rank's copy of a_0 | .. | a_{N-1} (N n,)."""
    whole = np.concatenate(buffers)  # (N n,)
    return [whole.copy() for _ in buffers]


def reduce_scatter(buffers: list[Array]) -> list[Array]:
    """[g_0, .., g_{N-1}] (N n,) each -> rank r's slice r (n,) of their sum."""
    total = _add_up(buffers)  # (N n,)
    return [part.copy() for part in np.split(total, len(buffers))]


def all_reduce(buffers: list[Array]) -> list[Array]:
    """[g_0, .., g_{N-1}] -> every rank's copy of their sum."""
    total = _add_up(buffers)
    return [total.copy() for _ in buffers]


def _add_up(buffers: list[Array]) -> Array:
    total = buffers[0].copy()
    for buffer in buffers[1:]:  # in rank order
        total += buffer
    return total


class CollectiveLog:
    """The collectives one device runs, in order: (kind, bytes of the whole buffer)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def record(self, kind: str, nbytes: int) -> None:
        self.calls.append((kind, int(nbytes)))

    def summary(self) -> dict[str, dict[str, int]]:
        """{kind: {"count": calls, "bytes": their bytes added up}}."""
        out: dict[str, dict[str, int]] = {}
        for kind, nbytes in self.calls:
            entry = out.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += nbytes
        return out


# ------------------------------------------------------------------- tensor-parallel blocks
class TensorParallelAttention(Module):
    """One attention block over K model ranks: rank t holds columns t of w_q, w_k and w_v (its
    num_heads / K query heads and num_kv_heads / K key/value heads) and rows t of w_o."""

    def __init__(
        self, attention: MultiHeadAttention, tensor_parallel: int, log: CollectiveLog | None
    ):
        super().__init__()
        self.config, self.log = attention.config, log
        self.ranks = [local_attention(attention, tensor_parallel) for _ in range(tensor_parallel)]
        self.output_bias: Array | None = None  # (d_model,): w_o's bias, added once after the sum

    def __call__(self, query, key, value, mask=None, need_weights=False, cache=None, position=0):
        # each rank's heads, through its rows of w_o: a part of the output
        partials = [rank(query, key, value, mask, False, cache, position)[0] for rank in self.ranks]
        output = self.all_reduce(partials)  # (B, T_q, d_model): their sum
        if self.output_bias is not None:
            output = output + self.output_bias  # (B, T_q, d_model)
        return output, None

    def backward(self, grad_output: Array) -> tuple[tuple[Array, Array, Array], dict[str, Any]]:
        """-> (grad_query, grad_key, grad_value), {name: [rank 0's gradient, ..]}: every rank saw
        the whole input, so the input's gradient is the sum of the ranks' parts."""
        per_rank = [rank.backward(grad_output) for rank in self.ranks]
        grad_query = self.all_reduce([grads[0] for (grads, _) in per_rank])  # (B, T_q, d_model)
        # key and value in one buffer: (2, B, T_k, d_model)
        grad_key_value = self.all_reduce([np.stack(grads[1:]) for (grads, _) in per_rank])
        return (grad_query, grad_key_value[0], grad_key_value[1]), self._grads(
            per_rank, grad_output
        )

    def self_attention_backward(self, grad_output: Array) -> tuple[Array, dict[str, Any]]:
        """One x was the query, the key and the value: each rank adds its three parts, and one
        all-reduce adds the ranks'."""
        per_rank = [rank.self_attention_backward(grad_output) for rank in self.ranks]
        grad_x = self.all_reduce([grad for grad, _ in per_rank])  # (B, T, d_model)
        return grad_x, self._grads(per_rank, grad_output)

    def cross_attention_backward(
        self, grad_output: Array
    ) -> tuple[tuple[Array, Array], dict[str, Any]]:
        """One memory was the key and the value: each rank adds its two parts of the memory's
        gradient, and two all-reduces add the ranks' (the query's, the memory's)."""
        per_rank = [rank.cross_attention_backward(grad_output) for rank in self.ranks]
        grad_query = self.all_reduce([grads[0] for (grads, _) in per_rank])  # (B, T_q, d_model)
        grad_memory = self.all_reduce([grads[1] for (grads, _) in per_rank])  # (B, T_k, d_model)
        return (grad_query, grad_memory), self._grads(per_rank, grad_output)

    def all_reduce(self, partials: list[Array]) -> Array:
        if self.log is not None:
            self.log.record("all-reduce", partials[0].nbytes)
        return all_reduce(partials)[0]

    def _grads(self, per_rank: list, grad_output: Array) -> dict[str, Any]:
        grads: dict[str, Any] = {name: [g[name] for _, g in per_rank] for name in per_rank[0][1]}
        if self.output_bias is not None:  # added after the sum: the same on every rank
            rows = grad_output.reshape(-1, grad_output.shape[-1])  # (B T_q, d_model)
            grads["w_o.bias"] = rows.sum(axis=0)  # (d_model,)
        return grads


class TensorParallelFeedForward(Module):
    """One feed-forward block over K model ranks: rank t holds columns t of w_1 (or w_gate and
    w_up), its d_ff / K hidden features, and rows t of w_2 (or w_down)."""

    def __init__(self, ffn, tensor_parallel: int, log: CollectiveLog | None):
        super().__init__()
        self.config, self.log = ffn.config, log
        self.out = "w_down" if isinstance(ffn, GatedFeedForward) else "w_2"
        self.ranks = [local_feed_forward(ffn, tensor_parallel) for _ in range(tensor_parallel)]
        self.output_bias: Array | None = None  # (d_model,): the last layer's bias, added once

    def __call__(self, x: Array) -> Array:
        partials = [rank(x) for rank in self.ranks]  # (B, T, d_model) each: its features' part
        output = self.all_reduce(partials)  # (B, T, d_model)
        if self.output_bias is not None:
            output = output + self.output_bias
        return output

    def backward(self, grad_output: Array) -> tuple[Array, dict[str, Any]]:
        per_rank = [rank.backward(grad_output) for rank in self.ranks]
        grad_x = self.all_reduce([grad for grad, _ in per_rank])  # (B, T, d_model)
        grads: dict[str, Any] = {name: [g[name] for _, g in per_rank] for name in per_rank[0][1]}
        if self.output_bias is not None:  # added after the sum: the same on every rank
            rows = grad_output.reshape(-1, grad_output.shape[-1])  # (B T, d_model)
            grads[f"{self.out}.bias"] = rows.sum(axis=0)  # (d_model,)
        return grad_x, grads

    all_reduce = TensorParallelAttention.all_reduce


def local_attention(attention: MultiHeadAttention, tensor_parallel: int) -> MultiHeadAttention:
    """Model rank t's part of ``attention``: the same module with 1/K of the heads, and w_o
    without its bias (``TensorParallelAttention`` adds it once)."""
    config, k, dtype = attention.config, tensor_parallel, weights_dtype(attention)
    local = MultiHeadAttention(config, dtype, rotary=isinstance(attention.rotary, RotaryEmbedding))
    local.num_heads, local.num_kv_heads = config.num_heads // k, config.num_kv_heads // k
    d_q, d_kv = local.num_heads * config.d_k, local.num_kv_heads * config.d_k
    bias = config.attention_bias
    local.w_q = Linear(config.d_model, d_q, bias, dtype)
    local.w_k = Linear(config.d_model, d_kv, bias, dtype)
    local.w_v = Linear(config.d_model, d_kv, bias, dtype)
    local.w_o = Linear(d_q, config.d_model, False, dtype)
    return local


def local_feed_forward(ffn, tensor_parallel: int):
    """Model rank t's part of ``ffn``: d_ff / K hidden features, the last layer without its bias."""
    config, dtype = ffn.config, weights_dtype(ffn)
    local = make_feed_forward(config, dtype)
    d_ff, bias = config.d_ff // tensor_parallel, config.ffn_bias
    if isinstance(local, GatedFeedForward):
        local.w_gate = Linear(config.d_model, d_ff, bias, dtype)
        local.w_up = Linear(config.d_model, d_ff, bias, dtype)
        local.w_down = Linear(d_ff, config.d_model, False, dtype)
    else:
        local.w_1 = Linear(config.d_model, d_ff, bias, dtype)
        local.w_2 = Linear(d_ff, config.d_model, False, dtype)
    return local


# ---------------------------------------------------------------------------- dropout on a device
class WholeMaskDropout(Module):
    """A Dropout, wrapped from outside, on one device of a plan: it draws the mask of the whole
    activation, every device's part of it, from its stream (each device's copy of the one device's
    stream, where the one device's stands) and keeps this device's part, so a sharded step drops
    what one device drops. ``parts``: (axis, devices along it, this device's index) for each way
    the activation is split: the data rank's rows (axis 0), and inside a tensor-parallel block the
    model rank's heads of the attention weights (axis 1) or hidden features of the feed-forward
    (axis -1); where the activation is whole on every model rank (the embeddings' and each
    sub-layer's output) the rows alone. Each device draws every device's random numbers: ``log``
    (device 0's) records (drawn, kept) for each mask."""

    def __init__(self, dropout: Dropout, parts: tuple[tuple[int, int, int], ...], log: list | None):
        super().__init__()
        self.dropout, self.parts, self.log = dropout, parts, log

    @property
    def rate(self) -> float:  # read by the fused kernels, which run only without dropout
        return self.dropout.rate

    @property
    def training(self) -> bool:
        return self.dropout.training

    @training.setter
    def training(self, mode: bool) -> None:  # model.train() and model.eval() set it
        self.dropout.training = mode

    @property
    def saved(self):  # the multiplier the attention's backward reads
        return self.dropout.saved

    def __call__(self, x: Array) -> Array:
        dropout = self.dropout
        if not dropout.training or dropout.rate == 0:
            return dropout(x)  # nothing dropped
        whole = list(x.shape)
        for axis, devices, _ in self.parts:
            whole[axis] *= devices  # the activation on one device
        keep = dropout.rng.random(whole) >= dropout.rate  # the one device's mask, as Dropout's
        for axis, devices, index in self.parts:
            keep = np.split(keep, devices, axis=axis)[index]  # (...,) like x: this device's part
        multiplier = keep.astype(x.dtype) / (1.0 - dropout.rate)  # (...,) like x
        dropout.keep(multiplier=multiplier)  # for its backward
        if self.log is not None:
            self.log.append((int(np.prod(whole)), keep.size))
        return x * multiplier  # (...,) like x

    def backward(self, grad_output: Array) -> tuple[Array, dict]:
        return self.dropout.backward(grad_output)


def keep_own_parts(
    model, plan: Plan, data_rank: int, log: list | None = None
) -> Callable[[], None]:
    """Each Dropout of data rank ``data_rank``'s ``model`` a ``WholeMaskDropout`` that keeps its
    device's part of the one device's mask: the data rank's rows, and inside each tensor-parallel
    block each model rank's heads or hidden features. ``log``: device 0's draws. -> a function that
    puts the Dropouts back."""
    rows = ((0, plan.data, data_rank),)
    wrapped = []  # (module, attribute, the Dropout)
    for _, module in named_submodules(model):
        if isinstance(module, (TensorParallelAttention, TensorParallelFeedForward)):
            # (B, H, T_q, T_k): its heads; (B, T, d_ff): its hidden features
            axis = 1 if isinstance(module, TensorParallelAttention) else -1
            for t, rank in enumerate(module.ranks):
                parts = (*rows, (axis, plan.tensor_parallel, t))
                wrapped.append((rank, "dropout", rank.dropout))
                rank.dropout = WholeMaskDropout(rank.dropout, parts, log if t == 0 else None)
        for attr, child in list(vars(module).items()):
            if isinstance(child, Dropout):  # whole on every model rank: the rows alone
                wrapped.append((module, attr, child))
                setattr(module, attr, WholeMaskDropout(child, rows, log))

    def unwrap() -> None:
        for module, attr, dropout in wrapped:
            setattr(module, attr, dropout)

    return unwrap


# ------------------------------------------------------------------------------ the devices
class Device:
    """What one device keeps: its piece of every weight, of its gradient and of Adam's two moments,
    and for a while a unit's whole weights or gradients. ``peak``: the most bytes it held."""

    def __init__(self, params: dict[str, Array]):
        self.params = params
        self.grads = {name: np.zeros_like(p) for name, p in params.items()}
        self.m = {name: np.zeros_like(p) for name, p in params.items()}  # Adam's first moments
        self.v = {name: np.zeros_like(p) for name, p in params.items()}  # and second
        self.held: dict[str, list[Array]] = {}  # for a while: "weights <unit>", "grads <unit>"
        self.peak = self.bytes_held()

    def hold(self, what: str, arrays: list[Array]) -> None:
        self.held[what] = arrays
        self.peak = max(self.peak, self.bytes_held())

    def drop(self, what: str) -> None:
        self.held.pop(what, None)

    def bytes_held(self) -> int:
        kept = [*self.params.values(), *self.grads.values(), *self.m.values(), *self.v.values()]
        return sum(a.nbytes for a in kept) + sum(
            a.nbytes for arrays in self.held.values() for a in arrays
        )


class ShardedUnit(Module):
    """One layer as FSDP runs it: its weights gathered just before its forward and its backward,
    dropped after each, and its gradients reduced over the data ranks after its backward."""

    def __init__(self, layer, unit: str, replica: Replica):
        super().__init__()
        self.layer, self.unit = layer, unit
        # the replica's moves (bound methods: the module tree does not reach the other replicas)
        self.gather, self.release = replica.gather, replica.release
        self.reduce_gradients = replica.reduce_gradients

    def __call__(self, *args, **kwargs):
        self.gather(self.unit)
        output = self.layer(*args, **kwargs)
        self.release(self.unit)
        return output

    def backward(self, grad_output):
        self.gather(self.unit)  # again: FSDP dropped them after the forward
        grad_input, grads = self.layer.backward(grad_output)
        self.release(self.unit)
        self.reduce_gradients(self.unit, with_prefix(self.unit, grads))
        return grad_input, {}  # this unit's gradients are in the devices now


class DataAxis:
    """Where the data ranks of model rank t meet: each hands in its buffer and waits for the others;
    data rank 0 runs the collective over the list; each takes its own result."""

    def __init__(self, plan: Plan, log: CollectiveLog):
        self.size, self.log = plan.data, log
        self.barriers = [threading.Barrier(plan.data) for _ in range(plan.tensor_parallel)]
        self.inbox: list[list[Array | None]] = [
            [None] * plan.data for _ in range(plan.tensor_parallel)
        ]
        self.outbox: list[list[Array]] = [[] for _ in range(plan.tensor_parallel)]

    def run(
        self, kind: str, collective: Callable, model_rank: int, data_rank: int, buffer: Array
    ) -> Array:
        t = model_rank
        self.inbox[t][data_rank] = buffer
        self.barriers[t].wait()  # every data rank has handed in its buffer
        if data_rank == 0:
            self.outbox[t] = collective(list(self.inbox[t]))
            if t == 0:  # device 0's group
                self.log.record(kind, max(buffer.nbytes, self.outbox[t][0].nbytes))
        self.barriers[t].wait()  # the results are out
        return self.outbox[t][data_rank]

    def abort(self) -> None:
        for barrier in self.barriers:
            barrier.abort()


class Replica:
    """Data rank d: the model its K devices run (tensor-parallel blocks, FSDP units), and those
    devices."""

    def __init__(self, run: ShardedRun, data_rank: int, params: Mapping[str, Array]):
        self.run, self.data_rank = run, data_rank
        plan = run.plan
        self.devices = [
            Device(
                {
                    name: piece(params[name], where, plan, data_rank, t)
                    for name, where in run.weights.items()
                }
            )
            for t in range(plan.tensor_parallel)
        ]
        self.model = build_model(run.config, params)
        log = run.log if data_rank == 0 else None  # count device 0's collectives
        # each Dropout's copies on this data rank's devices, in the one device's order (its streams)
        dropouts = [m for _, m in named_submodules(self.model) if isinstance(m, Dropout)]
        copies = {id(dropout): [dropout] for dropout in dropouts}
        if plan.tensor_parallel > 1:
            for _, module in named_submodules(self.model):
                for attr, child in list(vars(module).items()):
                    if isinstance(child, MultiHeadAttention):
                        block = TensorParallelAttention(child, plan.tensor_parallel, log)
                    elif isinstance(child, (PositionwiseFeedForward, GatedFeedForward)):
                        block = TensorParallelFeedForward(child, plan.tensor_parallel, log)
                    else:
                        continue
                    setattr(module, attr, block)
                    copies[id(child.dropout)] = [rank.dropout for rank in block.ranks]  # one each
        self.dropouts = [copies[id(dropout)] for dropout in dropouts]
        keep_own_parts(self.model, plan, data_rank, run.draws if data_rank == 0 else None)
        for unit, _ in run.units[:-1]:  # each layer; the rest is gathered around the whole step
            stack, index = unit.rsplit(".", 1)
            layers = getattr(self.model, stack.split(".")[0]).layers
            layers[int(index)] = ShardedUnit(layers[int(index)], unit, self)
        self.slots = {
            (name, t): self._slot(name, t)
            for name in run.weights
            for t in range(plan.tensor_parallel)
        }
        for module, leaf in self.slots.values():
            setattr(module, leaf, None)  # no weight is whole until a unit gathers it

    def _slot(self, name: str, t: int) -> tuple[Any, str]:
        """(module, attribute) that holds model rank t's ``name`` in this replica's model."""
        *path, leaf = name.split(".")
        module = self.model
        for i, part in enumerate(path):
            module = module[int(part)] if part.isdigit() else getattr(module, part)
            module = module.layer if isinstance(module, ShardedUnit) else module
            if isinstance(module, (TensorParallelAttention, TensorParallelFeedForward)):
                if path[i + 1] in ("w_o", "w_2", "w_down") and leaf == "bias":
                    return module, "output_bias"
                module = module.ranks[t]
        return module, leaf

    # -------------------------------------------------------------------- FSDP's three moves
    def gather(self, unit: str) -> None:
        """Put the unit's whole weights into the model: all-gathered from the data ranks' pieces
        under FSDP, else the device's own (whole) ones."""
        run = self.run
        for t, device in enumerate(self.devices):
            names = run.unit_names[unit]
            if run.plan.fsdp > 1:
                buffer = np.concatenate(
                    [device.params[name].ravel() for name in names]
                )  # its pieces
                # every data rank's buffer, in rank order
                gathered = run.data_axis.run("all-gather", all_gather, t, self.data_rank, buffer)
                whole = run.unflatten(np.split(gathered, run.plan.fsdp), names)
                device.hold(f"weights {unit}", list(whole.values()))
            else:
                whole = {name: device.params[name] for name in names}
            for name, weight in whole.items():
                if t == 0 or run.weights[name].tensor_parallel is not None:  # else: set by rank 0
                    module, leaf = self.slots[(name, t)]
                    setattr(module, leaf, weight)

    def release(self, unit: str) -> None:
        """FSDP drops a unit's whole weights once it has run; data parallel keeps them."""
        if self.run.plan.fsdp > 1:
            for t, device in enumerate(self.devices):
                for name in self.run.unit_names[unit]:
                    module, leaf = self.slots[(name, t)]
                    setattr(module, leaf, None)
                device.drop(f"weights {unit}")

    def reduce_gradients(self, unit: str, grads: Mapping[str, Any]) -> None:
        """The unit's gradients of this data rank's rows -> the sum over the data ranks, each device
        keeping its own piece: reduce-scattered under FSDP, all-reduced under data parallel."""
        run, names = self.run, self.run.unit_names[unit]
        for t, device in enumerate(self.devices):
            local = {n: grads[n][t] if isinstance(grads[n], list) else grads[n] for n in names}
            device.hold(f"grads {unit}", list(local.values()))
            if run.plan.fsdp > 1:
                # data rank f's slice of every gradient, then f + 1's: f's slice is its pieces
                pieces = [
                    run.fsdp_piece(local[n], n, f) for f in range(run.plan.fsdp) for n in names
                ]
                buffer = np.concatenate([p.ravel() for p in pieces])
                mine = run.data_axis.run(
                    "reduce-scatter", reduce_scatter, t, self.data_rank, buffer
                )
                device.grads.update(run.unflatten([mine], names))
            elif run.plan.data_parallel > 1:
                buffer = np.concatenate([local[n].ravel() for n in names])
                total = run.data_axis.run("all-reduce", all_reduce, t, self.data_rank, buffer)
                device.grads.update(run.unflatten([total], names))
            else:
                device.grads.update(local)
            device.drop(f"grads {unit}")

    def all_reduce_scalar(self, value: float) -> float:
        """A number summed over the data ranks (the target count, the loss)."""
        if self.run.plan.data == 1:
            return value
        total = self.run.data_axis.run(
            "all-reduce", all_reduce, 0, self.data_rank, np.array([value])
        )
        return float(total[0])

    # ----------------------------------------------------------------------------- one step
    def loss_and_grads(
        self, batch: Mapping[str, Array], label_smoothing: float
    ) -> tuple[float, Array]:
        """This data rank's forward and backward on its rows; the gradients end up in its devices.
        -> (the global batch's loss, this rank's logits)."""
        config, plan = self.run.config, self.run.plan
        rows = shard(config, batch, self.data_rank, plan.data)  # this data rank's rows
        inputs, targets = split_batch(config, rows)
        count = token_count(config, rows)  # its non-pad targets
        total = self.all_reduce_scalar(count)  # every data rank's
        weight = count / max(total, 1)  # its share of the loss (data_parallel.py)
        self.gather("")  # the rest of the model: embeddings, final norms, output projection
        with enable_grad():
            logits = self.model(*(np.asarray(x) for x in inputs)).logits  # (B / D, T, V)
        targets = np.asarray(targets)  # (B / D, T)
        loss = weight * float(cross_entropy(logits, targets, config.pad_id, label_smoothing))
        grad_logits = cross_entropy_backward(
            logits, targets, config.pad_id, label_smoothing, weight
        )
        _, grads = self.model.backward(grad_logits)  # the layers' went to the devices already
        self.release("")
        self.reduce_gradients("", grads)
        return self.all_reduce_scalar(loss), logits


class ShardedRun:
    """A model spread over the devices of ``plan``: every device's pieces, the replicas that run
    them, Adam's step, and the log of device 0's collectives."""

    def __init__(self, model, plan: Plan, schedule: Callable[[int], float] = lambda t: 0.0,
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9):  # fmt: skip
        self.config, self.plan, self.schedule, self.betas, self.eps = (
            model.config,
            plan,
            schedule,
            betas,
            eps,
        )
        check_plan(model.config, plan)  # every weight splits evenly
        self.log = CollectiveLog()
        self.weights: dict[str, Placement] = plan_weights(self.config, plan)
        self.shapes = param_schema(self.config)
        self.units = fsdp_units(self.config)
        self.unit_names = dict(self.units)
        self.data_axis = DataAxis(plan, self.log)
        self.t = 0  # Adam's step
        self.draws: list[tuple[int, int]] = []  # device 0's dropout masks: (drawn, kept) numbers
        params = to_params(model)
        self.replicas = [Replica(self, d, params) for d in range(plan.data)]

    def dropout_streams(self) -> list[Any]:
        """Each Dropout's random stream where it stands, as one device's ``dropout_streams`` gives
        them: device 0's copies, where every device's stand (each drew the one device's masks)."""
        return [copies[0].rng.bit_generator.state for copies in self.replicas[0].dropouts]

    def set_dropout_streams(self, streams: list[Any]) -> None:
        """Every device's copy of each Dropout's stream put where ``streams`` (one device's
        ``dropout_streams``) say: the next masks are those one device would draw."""
        for replica in self.replicas:
            for copies, stream in zip(replica.dropouts, streams, strict=True):
                for dropout in copies:
                    dropout.rng.bit_generator.state = stream

    def piece_shape(self, name: str) -> tuple[int, ...]:
        shape, where = list(self.shapes[name]), self.weights[name]
        if where.model_dim is not None:
            shape[where.model_dim] //= self.plan.tensor_parallel
        if where.fsdp_dim is not None:
            shape[where.fsdp_dim] //= self.plan.fsdp
        return tuple(shape)

    def fsdp_piece(self, local: Array, name: str, data_rank: int) -> Array:
        """Data rank ``data_rank``'s FSDP slice of a model rank's (whole) ``local`` weight."""
        where = self.weights[name]
        if where.fsdp_dim is None:
            return local
        return np.split(local, self.plan.fsdp, axis=where.fsdp_dim)[data_rank]

    def unflatten(self, buffers: list[Array], names: list[str]) -> dict[str, Array]:
        """Flat buffers, one per data rank in order, each its pieces of ``names`` one after the
        other -> {name: the pieces joined along FSDP's dimension}."""
        parts: dict[str, list[Array]] = {name: [] for name in names}
        for buffer in buffers:
            start = 0
            for name in names:
                shape = self.piece_shape(name)
                size = int(np.prod(shape))
                parts[name].append(buffer[start : start + size].reshape(shape))
                start += size
        return {
            name: np.concatenate(p, axis=self.weights[name].fsdp_dim) if len(p) > 1 else p[0]
            for name, p in parts.items()
        }

    def loss_and_grads(
        self, batch: Mapping[str, Array], label_smoothing: float = 0.0
    ) -> tuple[float, Array]:
        """Every data rank's forward and backward, at the same time (one thread each: they wait for
        each other at every collective). -> (the loss, the logits of the whole batch)."""
        results: list[Any] = [None] * self.plan.data
        errors: list[BaseException] = []

        def run_replica(d: int) -> None:
            try:
                results[d] = self.replicas[d].loss_and_grads(batch, label_smoothing)
            except BaseException as error:  # noqa: BLE001 -- the others must stop waiting
                errors.append(error)
                self.data_axis.abort()

        if self.plan.data == 1:
            run_replica(0)
        else:
            threads = [
                threading.Thread(target=run_replica, args=(d,)) for d in range(self.plan.data)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            first = next(
                (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
            )
            raise first
        return results[0][0], np.concatenate([logits for _, logits in results])

    def adam_step(self) -> None:
        """Adam on every device's own pieces: the update optim.Adam makes, element by element."""
        self.t += 1
        b1, b2 = self.betas
        lr = float(self.schedule(self.t))
        correction1, correction2 = 1.0 - b1**self.t, 1.0 - b2**self.t
        for replica in self.replicas:
            for device in replica.devices:
                for name, param in device.params.items():
                    g, m, v = device.grads[name], device.m[name], device.v[name]
                    m *= b1
                    m += (1.0 - b1) * g
                    v *= b2
                    v += (1.0 - b2) * g * g
                    param -= lr * (m / correction1) / (np.sqrt(v / correction2) + self.eps)

    def step(self, batch: Mapping[str, Array], label_smoothing: float = 0.0) -> float:
        loss, _ = self.loss_and_grads(batch, label_smoothing)
        for rank in range(self.plan.devices):  # a device planned to die here does, between
            maybe_fail("step", self.t + 1, rank, kill=False)  # its gradients and its update
        self.adam_step()
        return loss

    def whole(self, tensors: str = "params") -> dict[str, Array]:
        """Every weight (or gradient, or moment: "grads", "m", "v") whole, under its canonical name:
        joined from the pieces of data replica 0's devices (the same as every replica's)."""
        out = {}
        for name, where in self.weights.items():
            pieces = {
                (f, t): getattr(self.replicas[f].devices[t], tensors)[name]
                for f in range(self.plan.fsdp)
                for t in range(self.plan.tensor_parallel)
            }
            # a copy: a weight split nowhere is the device's own array, which Adam updates in place
            out[name] = np.array(join(pieces, where, self.plan))
        return out

    def peak_bytes(self) -> list[int]:
        """Each device's peak (rank order): bytes of weights, gradients and Adam moments held."""
        return [device.peak for replica in self.replicas for device in replica.devices]


# --------------------------------------------------------------------------- the entry points
def sharded_loss_and_grads(
    model, batch: Mapping[str, Array], plan: Plan, label_smoothing: float = 0.0
) -> tuple[float, dict[str, Array]]:
    """-> (the loss of the global ``batch``, {canonical name: whole gradient}) from one backward
    over ``plan``'s devices (the model is not changed)."""
    check_plan(model.config, plan, batch_size(model.config, batch))
    run = ShardedRun(model, plan)
    loss, _ = run.loss_and_grads(batch, label_smoothing)
    return loss, run.whole("grads")


def step_collectives(
    model, batch: Mapping[str, Array], plan: Plan, label_smoothing: float = 0.0
) -> dict[str, dict[str, int]]:
    """The collectives device 0 runs in one training step: {kind: {"count": n, "bytes": b}}."""
    check_plan(model.config, plan, batch_size(model.config, batch))
    run = ShardedRun(model, plan)
    run.step(batch, label_smoothing)
    return run.log.summary()


def step_dropout_draws(
    model, batch: Mapping[str, Array], plan: Plan, label_smoothing: float = 0.0
) -> dict[str, int]:
    """What device 0 draws for its dropout masks in one training step, from ``model``'s streams
    where they stand (the model is not changed): {"masks": how many, "drawn": the random numbers
    drawn, the whole activations' (one device's), "kept": those of its own part}. NumPy draws one
    float64, 64 random bits, per number."""
    check_plan(model.config, plan, batch_size(model.config, batch))
    run = ShardedRun(model, plan)
    run.set_dropout_streams(dropout_streams(model))
    for replica in run.replicas:
        replica.model.train()
    run.step(batch, label_smoothing)
    return {
        "masks": len(run.draws),
        "drawn": sum(drawn for drawn, _ in run.draws),
        "kept": sum(kept for _, kept in run.draws),
    }


def sharded_train(
    model,
    batches: Sequence[Mapping[str, Array]],
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
    max_restarts: int = 0,
) -> list[float]:
    """``train`` with the weights, gradients and Adam's moments spread over ``plan``'s devices; the
    loop is ``transformer_run.train``'s. ``model`` holds the trained weights, whole, at the end
    (and at every ``checkpoint(state)``, whose moments are whole too).

    ``checkpoint_dir``: a sharded checkpoint there at the same steps (each device writes its own
    pieces; ``transformer_run.sharded_checkpoint``), with ``run_record`` in its training.json.
    ``resume``: a NumPy sharded checkpoint saved under any plan (``sharded_checkpoint.read``): the
    run goes on from its step, each device taking the pieces of ``plan`` from it. Or a whole
    ``TrainingState`` (a checkpoint file's, any backend's) whose weights ``model`` holds already.

    ``max_restarts``: a device lost (``LostDeviceError``: ``transformer_run.faults``) ends the
    run, or, up to this many times, restarts it from the newest committed checkpoint in
    ``checkpoint_dir`` (from the start where there is none yet), as torchrun restarts a job."""
    for batch in batches:
        check_plan(model.config, plan, batch_size(model.config, batch))
    run = ShardedRun(model, plan, schedule)
    start = to_params(model) if max_restarts else None  # a restart without a checkpoint: from here

    def seed_replicas(model, seed: int) -> None:
        seed_dropout(model, seed)  # the one device's streams: every device draws from a copy
        run.set_dropout_streams(dropout_streams(model))
        for replica in run.replicas:
            replica.model.train()

    def sharded_train_step(model, run: ShardedRun, batch, label_smoothing: float) -> float:
        return run.step(batch, label_smoothing)

    def whole_state(model, run: ShardedRun, losses: list[float]) -> TrainingState:
        load_whole(model, run.whole())
        moments = {f"m.{n}": m for n, m in run.whole("m").items()}
        moments |= {f"v.{n}": v for n, v in run.whole("v").items()}
        # every device drew the one device's masks: its streams stand where one device's would
        return TrainingState(run.t, list(losses), moments, run.dropout_streams())

    def state_of(model, run: ShardedRun, losses: list[float]) -> TrainingState:
        """Nothing gathered: the moments stay in the devices (whole only for ``checkpoint``)."""
        # every device draws the one device's masks: device 0's streams are the run's
        return TrainingState(run.t, list(losses), {}, run.dropout_streams())

    def save(state: TrainingState) -> None:
        if checkpoint_dir is not None:
            folder = sharded_checkpoint.staging(checkpoint_dir, state.step)
            numpy_checkpoint.save(folder, run)
            record = run_record or {}
            sharded_checkpoint.commit(checkpoint_dir, "numpy", run.config, plan, state, record)
        if checkpoint is not None:
            checkpoint(whole_state(model, run, state.losses))

    def restore(model, run: ShardedRun, state: TrainingState) -> None:
        if isinstance(resume, ShardedCheckpoint):
            numpy_checkpoint.restore(resume, run)
        else:
            numpy_checkpoint.restore_moments(state, run)
        if run.config.dropout > 0:  # without dropout no stream is read
            run.set_dropout_streams(state.dropout)

    if isinstance(resume, ShardedCheckpoint) and resume.framework != "numpy":
        raise ValueError(
            f"{resume.folder!r} is a {resume.framework} checkpoint: consolidate it into one file "
            "(transformer-ref checkpoint consolidate) to continue it in numpy"
        )
    saving = checkpoint is not None or checkpoint_dir is not None
    restarts = 0
    try:
        while True:
            try:
                return train_loop(
                    model, run, sharded_train_step, seed_replicas, batches, steps, label_smoothing,
                    callback, seed,
                    resume.state if isinstance(resume, ShardedCheckpoint) else resume,
                    save if saving else None, checkpoint_every, state_of, restore,
                )  # fmt: skip
            except LostDeviceError as lost:
                if restarts == max_restarts:
                    raise
                restarts += 1
                found = sharded_checkpoint.latest(checkpoint_dir) if checkpoint_dir else None
                if found is not None:
                    resume = sharded_checkpoint.read(found)
                load_whole(model, start)  # the run as it began; the checkpoint, if any, on top
                run = ShardedRun(model, plan, schedule)
                where = f"step {resume.state.step}'s checkpoint" if found else "the start"
                _log.warning("%s: restarting from %s (restart %d of %d)", lost, where, restarts,
                             max_restarts)  # fmt: skip
    finally:
        load_whole(model, run.whole())
        if run.t:  # and its streams, where one device's stand after the same steps
            set_dropout_streams(model, run.dropout_streams())


_log = logging.getLogger(__name__)


def load_whole(model, params: Mapping[str, Array]) -> None:
    """Write whole weights (canonical names) into ``model``'s own arrays."""
    for name, value in params.items():
        parent, leaf = parent_of(model, name)
        getattr(parent, leaf)[...] = value


__all__ = [
    "COLUMN",
    "ROW",
    "CollectiveLog",
    "Device",
    "Plan",
    "ShardedRun",
    "TensorParallelAttention",
    "TensorParallelFeedForward",
    "WholeMaskDropout",
    "all_gather",
    "all_reduce",
    "keep_own_parts",
    "reduce_scatter",
    "sharded_loss_and_grads",
    "sharded_train",
    "step_collectives",
    "step_dropout_draws",
]
