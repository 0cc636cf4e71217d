"""Sharded training on a JAX device mesh: FSDP and Megatron tensor parallelism, alone or
together, and with data parallelism.

The mesh has two axes, ``("data", "model")``, of sizes (data_parallel * fsdp, tensor_parallel).
The batch's rows are split over ``data``. Each weight gets a ``NamedSharding``:

- FSDP (``fsdp`` > 1): one dimension of every weight split over ``data`` (``P("data", None)``;
  which one: ``transformer_run.sharding.placement``): each device holds 1/N of every weight, of
  its gradient and of its Adam moments, and gathers a weight whole where its layer needs it;
- tensor parallel (``tensor_parallel`` > 1): Megatron's pairs, over ``model``. The matrices
  that open a block's inner width (w_q, w_k, w_v; w_1, or w_gate and w_up) are split by
  columns (``P(None, "model")``): each device computes its own heads, or its own slice of
  d_ff, from the whole input. The matrix that closes the block (w_o; w_2, or w_down) is split
  by rows (``P("model", None)``): each device multiplies its slice of the inner width by its
  rows, and the partial outputs are added over ``model``: one all-reduce per block. The key
  and value heads are split like the query heads, so a device's query heads find their shared
  key/value head (grouped-query attention) on the same device;
- data parallel (``data_parallel`` > 1, without FSDP): the weights whole on every device of
  ``data``, the gradients all-reduced.

Nothing in the model is written for a mesh. The step is train.py's ``_update`` (loss, gradients,
Adam, one program compiled by ``nnx.jit``, ahead of time with ``COMPILER_OPTIONS``), its loss
computed for the plan (``_loss``):

- with the batch split over ``data`` (FSDP, or data parallel) the loss is written out as NumPy's
  step is (``data_sharded_loss``): in ``jax.shard_map`` over the whole mesh each device runs the
  model on its rows with its pieces of the weights. Each unit's pieces travel in one flat buffer
  (``gather_unit``: under FSDP one all-gather, whose transpose JAX derives as one reduce-scatter of
  the unit's gradient; under data parallel the weights are whole, and the transpose is one
  all-reduce): the rest of the model (embeddings, final norms, output projection) made whole for
  the whole step, each encoder and decoder layer wrapped, from outside, in a ``ShardedLayer``,
  which under FSDP gathers its weights when it runs and again when the backward reaches it
  (``jax.checkpoint`` keeps the activations, not the whole weights), as torch's ``fully_shard``
  does per layer;
- with tensor parallel each attention and feed-forward block is wrapped, from outside, in a
  ``TensorParallelBlock``: the block's own code on each device's shards, with Megatron's two
  communications written out (``pcast`` at the entrance, whose transpose all-reduces the input's
  gradient once; ``psum`` at the exit). With the batch split over ``data`` it runs inside that
  step's ``shard_map``; alone, in its own, over ``model``.

Dropout: every device draws the one device's mask, of the whole activation, from the one device's
stream (where the one device's stands) and keeps its own part (``WholeMaskDropout``): its rows of
the batch, and inside a tensor-parallel block its heads of the attention weights or its hidden
features of the feed-forward; where the activation is whole on every device of ``model`` (the
embeddings' and each sub-layer's output), the whole width of its rows. So a sharded run with
dropout is the single-device run with the same seed, and the streams (a checkpoint's) advance as
one device's do. The price: each device draws the random bits of every device that shares the
activation, N times its own part along an axis split N ways.

``step_collectives`` lists the collectives from the compiled program; the test of the collectives
holds them to NumPy's written-out step, kind by kind, and says where they differ.

Adam's moments are sharded like their weights (``shard_optimizer``); each device updates its
shards. What a device holds at its peak is XLA's plan (``step_memory``). The step donates the
weights and moments, so that they are updated in place (without, the updated ones are new buffers
beside the old: a second copy), and the CPU compiler takes three options (``COMPILER_OPTIONS``) so
that a layer's whole weights live only while it runs. FSDP over 4 devices then allocates 0.25 of
one device's weights, gradients and moments for a step of the twelve-layer test case at d_model 576
(arguments, outputs and temporaries, activations included); at d_model 72 XLA's fixed temporaries
are a larger share (0.43; NumPy's written-out step, which counts no activations: 0.28).

A checkpoint is written from whole tensors (``to_params`` and ``training_state`` copy each
array off the devices, which joins its shards), under the canonical names, so it loads into one
device and into every backend. A sharded checkpoint (``sharded_train``'s ``checkpoint_dir``:
sharded_checkpoint.py, Orbax) writes the arrays as they are placed instead, each process its own
shards, and ``resume`` reads one saved under any plan into the shards this plan places.

Devices: as data_parallel.py's (``XLA_FLAGS=--xla_force_host_platform_device_count=N`` on a CPU,
set before JAX starts).

Across processes (``jax.distributed``, each process ``distributed.initialize``d: multi-host JAX)
the same code runs in every process on one mesh over all their devices; the plan must use them
all. What differs is only where arrays come from and go (``distributed.py``): each process places
the weights, Adam's moments and the batch from its own whole copy (``_put``), checks the batch's
values on that copy (``_placed``), and reads results (the gradients, a checkpoint's state, the
weights at the end) after they are made whole on every device, so every process reads the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_run.batches import split_batch
from transformer_run.faults import maybe_fail
from transformer_run.sharded_checkpoint import ShardedCheckpoint
from transformer_run.sharding import Plan, check_plan, placement
from transformer_run.train import TrainingState, train_loop
from transformer_spec.checks import inputs_checked

from . import distributed
from .checks import check_token_ids
from .kernels import fused_kernels
from .layers import Dropout, seed_dropout
from .loss import cross_entropy
from .mixed_precision import keep_random_streams
from .optim import Adam
from .params import to_params
from .train import dropout_streams, restore_training_state, set_dropout_streams, training_state


# ----------------------------------------------------------------------------- the plan
def weight_spec(name: str, shape: tuple[int, ...], plan: Plan) -> P:
    """The PartitionSpec of the canonical weight ``name`` of ``shape``: the plan's placement
    (transformer_run.sharding) in JAX's words: the dimension tensor parallelism splits on
    ``"model"``, the one FSDP splits on ``"data"``, the rest whole."""
    where = placement(name, shape, plan)
    spec: list[str | tuple[str, str] | None] = [None] * len(shape)
    if where.model_dim is not None:
        spec[where.model_dim] = "model"  # column split: (None, "model"); row split: ("model", None)
    if where.fsdp_dim is not None and where.fsdp_dim == where.model_dim:
        spec[where.fsdp_dim] = ("model", "data")  # a column-split bias: model, then data
    elif where.fsdp_dim is not None:
        spec[where.fsdp_dim] = "data"  # FSDP: ("data", None); under a row split ("model", "data")
    return P(*spec)


# ----------------------------------------------------------------------------- the mesh
def sharding_mesh(plan: Plan) -> jax.sharding.Mesh:
    """The ``("data", "model")`` mesh of ``plan.devices`` devices: the accelerators, else the
    CPU's (simulated ones too). Auto axes: GSPMD lays out what the code does not annotate."""
    devices = jax.devices()
    if jax.process_count() > 1 and len(devices) != plan.devices:  # every process's devices in it
        raise ValueError(
            f"the plan needs {plan.devices} devices; the {jax.process_count()} processes have "
            f"{len(devices)} ({jax.local_device_count()} each): across processes a plan takes all"
        )
    if len(devices) < plan.devices:
        devices = jax.devices("cpu")
    if len(devices) < plan.devices:
        raise ValueError(
            f"the plan needs {plan.devices} devices; JAX sees {len(devices)}: on a CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={plan.devices} before importing jax"
        )
    # across processes jax.devices() lists process 0's devices, then process 1's, ...; the mesh
    # takes them row by row (a row: one data rank's K devices along "model"), so with K devices
    # per process, or a multiple, tensor parallel's all-reduces stay inside a process (a machine)
    # and only "data" crosses processes: FSDP 2 x TP 2 on 2 x 2 devices is [[0, 1], [2048, 2049]]
    shape = (plan.data_parallel * plan.fsdp, plan.tensor_parallel)
    return jax.make_mesh(
        shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=devices[: plan.devices]
    )


def _keys(path: tuple) -> tuple[str, ...]:
    """A pytree path into an nnx.State -> its keys (the module attributes and list indices)."""
    return tuple(str(part.key) for part in path if isinstance(part, jax.tree_util.DictKey))


def _canonical(path: tuple) -> str:
    """An nnx state path -> the canonical name (nnx.Linear's ``kernel`` is our ``weight``)."""
    return re.sub(r"\.kernel$", ".weight", ".".join(_keys(path)))


def weight_shardings(model: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan) -> nnx.State:
    """A NamedSharding for every Param of ``model`` (by its canonical name), as an nnx.State."""
    params = nnx.state(model, nnx.Param)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, weight_spec(_canonical(path), x.shape, plan)), params
    )


def shard_model(model: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan) -> None:
    """The Params placed by ``weight_spec``; everything else (buffers such as the rotary and
    sinusoid tables, the dropout streams) whole on every device."""
    nnx.update(model, _put(nnx.state(model), NamedSharding(mesh, P())))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, _put(params, weight_shardings(model, mesh, plan)))


def shard_optimizer(optimizer: Adam, mesh: jax.sharding.Mesh, plan: Plan) -> None:
    """Adam's moments sharded like their weights (found by the weight's path at the end of the
    moment's path); its step count and learning rate whole on every device."""
    specs = {
        _keys(path): sharding.spec
        for path, sharding in jax.tree_util.tree_leaves_with_path(
            weight_shardings(optimizer.model, mesh, plan)
        )
    }

    def place(path, x):
        keys = _keys(path)
        for weight_path, spec in specs.items():
            if keys[-len(weight_path) :] == weight_path and x.shape != ():
                return NamedSharding(mesh, spec)
        return NamedSharding(mesh, P())

    state = nnx.state(optimizer.optimizer)
    shardings = jax.tree_util.tree_map_with_path(place, state)
    nnx.update(optimizer.optimizer, _put(state, shardings))


def shard_batch(batch: Mapping[str, Any], mesh: jax.sharding.Mesh) -> dict:
    """Each array of ``batch`` split by rows over ``data``, whole over ``model``."""
    rows = NamedSharding(mesh, P("data"))
    return {key: _put(np.asarray(x), rows) for key, x in batch.items()}


def gather(module: nnx.Module) -> None:
    """Back to one device (the default one; across processes, each process's first), every array
    whole."""
    if jax.process_count() == 1:
        nnx.update(module, jax.device_put(nnx.state(module), jax.devices()[0]))
    else:  # jax.devices()[0] is process 0's: each process keeps its own copy
        nnx.update(module, distributed.local(distributed.replicated(nnx.state(module))))


def _put(tree, shardings):
    """``jax.device_put``; on a mesh that spans processes, ``distributed.place`` (each process
    fills its own devices' shards from its whole copy: device_put cannot place a committed
    array on another process's devices)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return distributed.place(tree, shardings)


# ----------------------------------- FSDP and data parallel: the step written out in shard_map
def gather_unit(shards: list[jax.Array], names: list[str], plan: Plan) -> list[jax.Array]:
    """Inside the step's ``shard_map`` (``data_sharded_loss``): one unit's weights (a layer's, or
    the rest of the model's) whole for this device, travelling as NumPy's ``Replica.gather`` sends
    them, in one flat buffer, and JAX derives the backward, each collective's transpose:

    - FSDP: the device's pieces flattened into one buffer, the N buffers all-gathered over
      ``data``, each weight joined from the N devices' pieces along its FSDP dimension. The
      transpose of the all-gather is one reduce-scatter of the unit's flat gradient
      (``psum_scatter``): each device receives the sum over ``data`` of its own pieces;
    - data parallel: the weights are whole on every device already; their buffer is marked as
      each device's own (``pcast`` to varying over ``data``: the gradients differ per device, each
      from its rows). Its transpose is one all-reduce of the unit's flat gradient.

    With tensor parallel a unit travels in two buffers, where NumPy's and torch's devices send one:
    the pieces split over ``model`` (each device's own heads or slice of d_ff) and those whole on
    every device along ``model`` (norms, a closing Linear's bias). In ``shard_map`` an array is
    either the same on every device of an axis or not, and one buffer holding both would make the
    norms' weights differ per device as far as JAX knows: the norm's output, then each device's
    own, would reach the block past Megatron's "f", and the norm's gradient would need a sum of
    its own."""
    whole: list[jax.Array | None] = [None] * len(shards)
    where = [placement(name, w.shape, plan) for w, name in zip(shards, names, strict=True)]
    for split in (True, False):  # split over "model", or whole along it
        group = [i for i, w in enumerate(where) if (w.model_dim is not None) is split]
        if not group:
            continue
        dtypes = {shards[i].dtype for i in group}
        if len(dtypes) > 1:  # one buffer holds one dtype; a cast inside it would change the weights
            raise TypeError(f"a unit's weights travel in one buffer of one dtype, got {dtypes}")
        flat = jax.numpy.concatenate([shards[i].ravel() for i in group])  # (L,): the device's
        if plan.fsdp == 1:  # data parallel: whole already, each device's gradient its own
            flat = jax.lax.pcast(flat, "data", to="varying")  # (L,)
            every = flat[None]  # (1, L)
        else:
            every = jax.lax.all_gather(flat, "data")  # (N, L): device r's pieces in row r
        offset = 0
        for i in group:
            w, dim = shards[i], where[i].fsdp_dim  # the dimension FSDP split
            pieces = [every[r, offset : offset + w.size].reshape(w.shape) for r in range(plan.fsdp)]
            whole[i] = jax.numpy.concatenate(pieces, axis=dim) if len(pieces) > 1 else pieces[0]
            offset += w.size
    return whole


# What an FSDP unit's backward computes again rather than keeps: the all-gather, and the moves of
# data (slices, reshapes, joins, transposes, casts) that make its buffer into whole weights or
# that a weight passes through before its matmul. Keeping any of them would keep a whole weight.
REDONE = frozenset({
    "all_gather", "slice", "dynamic_slice", "reshape", "concatenate", "transpose", "squeeze",
    "expand_dims", "broadcast_in_dim", "convert_element_type", "reduce_precision", "copy", "name",
})  # fmt: skip


def _keep_all_but_moves(primitive, *_, **__) -> bool:
    """The checkpoint policy of an FSDP unit: keep every value the backward reads (the
    activations, the tensor-parallel sums) except what ``REDONE`` names, so the whole weights are
    gathered again. A policy by primitive, not by ``checkpoint_name``: a name keeps a value from
    being saved, not the values it is made from (the gathered buffer, its slices), and JAX's
    ``save_anything_except_these_names`` saves everything in the installed version."""
    return primitive.name not in REDONE


class ShardedLayer(nnx.Module):
    """One encoder or decoder layer as a unit of the written-out step (NumPy's ``ShardedUnit``),
    wrapped from outside (the layer's own code is unchanged). It runs inside the step's
    ``shard_map`` (``data_sharded_loss``), on the device's rows of the batch. Under FSDP, as
    torch's ``fully_shard`` wraps each layer:

    - forward: the layer's weights gathered whole along ``data`` (``gather_unit``: one all-gather),
      used, and dropped;
    - backward: ``jax.checkpoint`` keeps what the layer's backward reads except the whole weights
      (``_keep_all_but_moves``), so they are gathered again when the backward reaches the layer
      (the second all-gather), while the activations are the forward's; the gradient of the gather
      is one reduce-scatter of the layer's flat gradient, before the layer below runs.

    So a device holds its pieces, one layer's whole weights and gradients, and the activations,
    as torch's and NumPy's FSDP do. Under data parallel the weights are whole on every device;
    the layer's gradient is all-reduced as one buffer once its backward is done."""

    def __init__(self, layer: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan):
        self.layer, self.mesh, self.plan = layer, mesh, plan

    def __call__(self, x: jax.Array, *args):
        graphdef, params, rest = nnx.split(self.layer, nnx.Param, ...)
        named, treedef = jax.tree_util.tree_flatten_with_path(params)
        names = [_canonical(path) for path, _ in named]
        at = [i for i, arg in enumerate(args) if isinstance(arg, jax.Array)]  # masks, memory

        def run(pieces, x, arrays, rest):  # the layer, from the device's pieces of its weights
            whole = gather_unit(pieces, names, self.plan)
            full = list(args)
            for i, array in zip(at, arrays, strict=True):
                full[i] = array
            layer = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, whole), rest)
            unwrap = tensor_parallel_blocks(layer, self.mesh)  # with tensor parallel
            out = layer(x, *full)
            unwrap()
            return out, nnx.state(layer, nnx.Not(nnx.Param))  # the streams it advanced

        if self.plan.fsdp > 1:
            run = jax.checkpoint(run, policy=_keep_all_but_moves)  # its backward gathers again
        out, streams = run([w for _, w in named], x, tuple(args[i] for i in at), rest)
        nnx.update(self.layer, streams)
        return out


class WholeMaskDropout(nnx.Module):
    """A Dropout, wrapped from outside, on one device of a plan (inside a ``shard_map``): it draws
    the mask of the whole activation, every device's part of it, from the Dropout's own stream (the
    one device's stream, where the one device's stands) and keeps this device's part, so a sharded
    step drops what one device drops. ``parts``: (axis, mesh axis) for each way the activation is
    split: the rows over ``data`` (axis 0), and inside a tensor-parallel block the heads of the
    attention weights (axis 1) or the hidden features of the feed-forward (axis -1) over
    ``model``; where the activation is whole on every model rank (the embeddings' and each
    sub-layer's output) the rows alone. Each device draws every device's random bits."""

    def __init__(self, dropout: Dropout, parts: tuple[tuple[int, str], ...]):
        self.dropout, self.parts = dropout, parts

    @property
    def rate(self) -> float:  # read by the fused kernels, which run only without dropout
        return self.dropout.rate

    @property
    def deterministic(self) -> bool:
        return self.dropout.deterministic

    def __call__(self, x: jax.Array) -> jax.Array:
        if not _drops(self.dropout):
            return self.dropout(x)
        rate, whole = self.dropout.rate, list(x.shape)
        for axis, mesh_axis in self.parts:
            whole[axis] *= jax.lax.axis_size(mesh_axis)  # the activation on one device
        # the one device's mask, as Dropout draws it: (...) the whole activation's
        keep = jax.random.bernoulli(self.dropout.rngs(), 1.0 - rate, tuple(whole))
        for axis, mesh_axis in self.parts:
            size, axis = x.shape[axis], axis % x.ndim  # this device's part along it
            start = jax.lax.axis_index(mesh_axis) * size
            keep = jax.lax.dynamic_slice_in_dim(keep, start, size, axis)  # (...,) like x
        return jax.numpy.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)  # like x


def _stacks(model: nnx.Module) -> list[nnx.Module]:
    """The model's encoder and decoder (those it has): the modules that hold ``layers``."""
    return [getattr(model, n) for n in ("encoder", "decoder") if getattr(model, n, None)]


def wrap_units(model: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan) -> Callable[[], None]:
    """Inside the step's ``shard_map``: each Dropout of ``model`` a ``WholeMaskDropout`` that keeps
    the device's rows (a tensor-parallel block adds its heads or features:
    ``keep_own_heads_or_features``), each
    encoder and decoder layer a ``ShardedLayer``; -> a function that puts them back."""
    dropouts = [
        (module, name, child)
        for _, module in nnx.iter_graph(model)
        if isinstance(module, nnx.Module)
        for name, child in list(vars(module).items())
        if isinstance(child, Dropout)
    ]
    for module, name, child in dropouts:
        setattr(module, name, WholeMaskDropout(child, ((0, "data"),)))
    stacks = _stacks(model)
    for stack in stacks:
        stack.layers = nnx.List([ShardedLayer(layer, mesh, plan) for layer in stack.layers])

    def unwrap():
        for stack in stacks:
            stack.layers = nnx.List([unit.layer for unit in stack.layers])
        for module, name, child in dropouts:
            setattr(module, name, child)

    return unwrap


def data_sharded_loss(model, inputs: tuple, targets, label_smoothing: float, mesh, plan: Plan):
    """The loss of a step whose batch is split over ``data`` (FSDP, or data parallel), written out
    as NumPy's ``Replica.loss_and_grads`` is: in ``jax.shard_map`` over the mesh (``data`` and
    ``model``), each device runs the model on its rows of the batch with its pieces of the
    weights. The rest of the model (embeddings, final norms, output projection) is made whole at
    the start (``gather_unit``: under FSDP one all-gather; its gradient, one reduce-scatter or
    all-reduce at the end), each layer is a ``ShardedLayer``, and the loss is each device's share,
    count / total of the non-pad targets, summed over ``data`` (two all-reduces: the count, the
    loss). With tensor parallel each block's shards are the device's along ``model`` and its
    ``TensorParallelBlock`` runs inside, where ``model`` is already manual."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    specs = jax.tree_util.tree_map_with_path(
        lambda path, w: weight_spec(_canonical(path), w.shape, plan), params
    )

    def local(params, rest, inputs, targets):  # on each device: its pieces, its rows
        named, treedef = jax.tree_util.tree_flatten_with_path(params)
        leaves = [w for _, w in named]
        root = [i for i, (path, _) in enumerate(named) if "layers" not in _keys(path)]
        names = [_canonical(named[i][0]) for i in root]
        whole = gather_unit([leaves[i] for i in root], names, plan)
        for i, w in zip(root, whole, strict=True):
            leaves[i] = w
        copy = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves), rest)
        unwrap = wrap_units(copy, mesh, plan)
        with inputs_checked():  # checked eagerly, before the jit
            logits = copy(*inputs).logits  # (B / N, T, V): this device's rows
        unwrap()
        count = (targets != model.config.pad_id).sum()  # this device's non-pad targets
        total = jax.lax.psum(count, "data")  # every device's
        share = jax.numpy.maximum(count, 1) / jax.numpy.maximum(total, 1)  # its share of the mean
        loss = share * cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()
        return jax.lax.psum(loss, "data"), nnx.state(copy, nnx.Not(nnx.Param))

    run = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(specs, P(), P("data"), P("data")),
        out_specs=(P(), P()),
    )
    loss, rest = run(params, rest, inputs, targets)
    nnx.update(model, rest)  # the dropout streams it advanced
    return loss


def _loss(model, inputs: tuple, targets, label_smoothing: float, mesh, plan: Plan):
    """The step's loss: with the batch split over ``data``, written out (``data_sharded_loss``);
    tensor parallel alone, the model with each attention and feed-forward block a
    ``TensorParallelBlock``."""
    if plan.data > 1:
        return data_sharded_loss(model, inputs, targets, label_smoothing, mesh, plan)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    copy = nnx.merge(graphdef, params, rest)
    stacks = _stacks(copy)
    blocks = [tensor_parallel_blocks(layer, mesh) for stack in stacks for layer in stack.layers]
    with inputs_checked():  # checked eagerly, before the jit
        logits = copy(*inputs).logits  # (B, T, V)
    for unwrap in blocks:
        unwrap()
    keep_random_streams(model, copy)  # the dropout streams it advanced
    return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()


# XLA's CPU compiler, told to plan for memory: its default schedule runs independent work early
# (every layer's gather at the start of the backward); its common-subexpression pass (cse) merges
# each layer's second gather, in the backward, into its first (they gather the same pieces; on the
# CPU an optimization barrier does not stop it: the barriers are removed before the last cse), so
# every layer's whole weights would stay alive from the forward to the backward; and its all-reduce
# combiner packs data parallel's gradient reductions into one at the end of the backward.
COMPILER_OPTIONS = {
    "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
    "xla_disable_hlo_passes": "cpu-all-reduce-combiner,cse",
}


# the weights and Adam's moments donated: updated in place, so the step does not hold a second copy
@nnx.jit(static_argnames=("label_smoothing", "mesh", "plan"), donate_argnums=(0, 1))
def _sharded_update(model, optimizer, inputs, targets, label_smoothing, mesh, plan):
    """train.py's ``_update`` on the plan's model: loss, gradients and Adam, one program."""
    loss, grads = nnx.value_and_grad(_loss)(model, inputs, targets, label_smoothing, mesh, plan)
    optimizer.update(model, grads)  # each device updates its shards with its shards
    return loss


@nnx.jit(static_argnames=("label_smoothing", "mesh", "plan"))
def _sharded_loss_and_grads(model, inputs, targets, label_smoothing, mesh, plan):
    return nnx.value_and_grad(_loss)(model, inputs, targets, label_smoothing, mesh, plan)


_PROGRAMS: dict[tuple, Any] = {}  # the compiled programs, by what they were compiled for
_KEPT_PROGRAMS = 16  # the most recent


def _compile(step, *args, label_smoothing: float, mesh, plan: Plan):
    """``step`` (one of the two above) compiled ahead of time with ``COMPILER_OPTIONS``: the
    compiled program is called with the same nnx objects and arrays, without the static ones.
    Kept, as ``jax.jit`` keeps its own, for each graph of the nnx objects (their structure and
    static attributes) and each shape, dtype and placement of the arrays: ``step_collectives``
    and then ``sharded_train`` on the same model and plan compile one program, not two."""
    key = (step, label_smoothing, mesh, plan, *(_signature(arg) for arg in args))
    if key not in _PROGRAMS:
        lowered = step.lower(*args, label_smoothing, mesh, plan)
        _PROGRAMS[key] = lowered.compile(compiler_options=COMPILER_OPTIONS)
        while len(_PROGRAMS) > _KEPT_PROGRAMS:
            del _PROGRAMS[next(iter(_PROGRAMS))]  # the oldest
    return _PROGRAMS[key]


def _signature(arg) -> tuple:
    """What a compiled program depends on in ``arg``: an nnx object's graph, and each array's
    shape, dtype and sharding."""
    graph = nnx.graphdef(arg) if isinstance(arg, nnx.Pytree) else None
    leaves = jax.tree.leaves(nnx.state(arg) if graph is not None else arg)
    return graph, tuple((np.shape(x), str(x.dtype), getattr(x, "sharding", None)) for x in leaves)


def _checked(model, batch: Mapping[str, Any]) -> tuple[tuple, jax.Array]:
    """The batch's inputs and targets, checked eagerly (inside jit their values are unknown)."""
    inputs, targets = split_batch(model.config, batch)
    model.check_inputs(*inputs)
    check_token_ids("targets", targets, model.config.tgt_vocab_size, None)
    return tuple(inputs), targets


def _placed(model, batch: Mapping[str, Any], mesh) -> tuple[tuple, jax.Array]:
    """``batch`` split over ``data`` (``shard_batch``), its inputs and targets checked. Across
    processes the values are checked on this process's copy, before it is placed: a global array's
    rows are not all here to read."""
    if jax.process_count() == 1:
        return _checked(model, shard_batch(batch, mesh))
    _checked(model, batch)
    inputs, targets = split_batch(model.config, shard_batch(batch, mesh))
    return tuple(inputs), targets


def sharded_loss_and_grads(
    model, batch: Mapping[str, Any], plan: Plan, label_smoothing: float = 0.0
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the loss of the global ``batch``, {canonical name: whole gradient}), computed with
    ``model``'s weights sharded by ``plan``."""
    check_plan(model.config, plan, _rows(model, batch))
    mesh = sharding_mesh(plan)
    shard_model(model, mesh, plan)
    try:
        inputs, targets = _placed(model, batch, mesh)
        step = _compile(_sharded_loss_and_grads, model, inputs, targets,
                        label_smoothing=label_smoothing, mesh=mesh, plan=plan)  # fmt: skip
        loss, grads = step(model, inputs, targets)
        if jax.process_count() > 1:  # each process holds its shards: whole on every device first
            grads = distributed.replicated(grads)
        # the gradients, shaped like the Params, read out through to_params (whole, canonical)
        graphdef, _, others = nnx.split(model, nnx.Param, ...)
        return float(loss), to_params(nnx.merge(graphdef, grads, others))
    finally:
        gather(model)


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
    checkpoint: Callable[[Any], None] | None = None,
    checkpoint_every: int = 0,
    checkpoint_dir: str | None = None,
    resume: ShardedCheckpoint | TrainingState | None = None,
    run_record: dict | None = None,
) -> list[float]:
    """``train`` with the weights and Adam's moments sharded by ``plan``; the loop is
    ``transformer_run.train``'s (its ``checkpoint(state)`` receives whole tensors under the
    canonical names).

    ``checkpoint_dir``: a sharded checkpoint (``transformer_run.sharded_checkpoint``; the tensors
    written by ``sharded_checkpoint.save``, each process its own shards, nothing gathered) every
    ``checkpoint_every`` steps and after the last, ``run_record`` stored in its training.json.
    ``resume``: a JAX sharded checkpoint (``transformer_run.sharded_checkpoint.read``) saved under
    any plan: its weights and Adam's moments are read into the shards THIS plan places, and the
    run goes on from its step, with its losses and dropout streams. Or a whole ``TrainingState`` (a
    checkpoint file's, any backend's, ``consolidate``'s) whose weights ``model`` holds already."""
    whole = resume if isinstance(resume, TrainingState) else None
    resume = None if whole is not None else resume
    if resume is not None and resume.framework != "jax":
        raise ValueError(f"{resume.folder!r} is {resume.framework}'s sharded checkpoint, not JAX's")
    if resume is not None and resume.config != model.config:
        raise ValueError(f"{resume.folder!r} was saved from another model's config than this one's")
    for batch in batches:
        check_plan(model.config, plan, _rows(model, batch))
    mesh = sharding_mesh(plan)
    optimizer = Adam(model, schedule)
    shard_model(model, mesh, plan)
    shard_optimizer(optimizer, mesh, plan)
    across = jax.process_count() > 1  # the mesh spans processes
    for batch in batches if across else ():  # checked here: a global array's rows are not all here
        _checked(model, batch)
    sharded = [shard_batch(batch, mesh) for batch in batches]  # placed once, read every pass
    programs: dict[tuple, Any] = {}  # compiled once for each shape of batch (and smoothing)

    def step(model, optimizer: Adam, batch, label_smoothing: float = 0.0) -> float:
        inputs, targets = _checked(model, batch) if not across else split_batch(model.config, batch)
        inputs = tuple(inputs)
        optimizer.set_learning_rate()
        adam = optimizer.optimizer
        key = (tuple(np.shape(x) for x in jax.tree.leaves((inputs, targets))), label_smoothing)
        if key not in programs:
            programs[key] = _compile(
                _sharded_update, model, adam, inputs, targets,
                label_smoothing=label_smoothing, mesh=mesh, plan=plan,
            )  # fmt: skip
        # a process planned to die in this step does, as the others run it (they wait for it in
        # its collectives until the launcher stops them)
        maybe_fail("step", optimizer.t + 1, jax.process_index())
        return float(programs[key](model, adam, inputs, targets))

    state_of, save = training_state, checkpoint
    if across and checkpoint is not None:  # NumPy reads a global array only once it is whole

        def state_of(model, optimizer: Adam, losses: list[float]):
            weights, moments = distributed.replicated(  # whole on every device: one program
                (nnx.state(model), nnx.state(optimizer.optimizer))
            )
            nnx.update(model, weights)
            nnx.update(optimizer.optimizer, moments)
            return training_state(model, optimizer, losses)

        def save(state) -> None:
            try:
                checkpoint(state)  # to_params(model) reads the weights, whole (state_of)
            finally:  # placed by the plan again, for the next step
                shard_model(model, mesh, plan)
                shard_optimizer(optimizer, mesh, plan)

    if checkpoint_dir is not None:  # the sharded checkpoint first, from the arrays as placed
        whole_state_of, whole_save = state_of, save

        def state_of(model, optimizer: Adam, losses: list[float]):
            light = TrainingState(optimizer.t, list(losses), {}, dropout_streams(model))
            _save_sharded(checkpoint_dir, model, optimizer, plan, light, run_record or {})
            return whole_state_of(model, optimizer, losses) if checkpoint is not None else light

        def save(state) -> None:
            if checkpoint is not None:
                whole_save(state)

    restore, resumed = restore_training_state, whole
    if whole is not None:  # whole moments, put back as one device's, then placed by the plan

        def restore(model, optimizer: Adam, state: TrainingState) -> None:
            gather(optimizer.optimizer)  # whole, as the moments come: written in, not scattered
            restore_training_state(model, optimizer, state)
            shard_optimizer(optimizer, mesh, plan)

    if resume is not None:  # weights, moments and Adam's step from the shards, placed by this plan
        saved = resume.state
        resumed = TrainingState(saved.step, list(saved.losses), {}, saved.dropout)

        def restore(model, optimizer: Adam, state: TrainingState) -> None:
            from .sharded_checkpoint import restore as restore_shards

            restore_shards(resume.folder, model, optimizer, mesh, plan, state.step)
            set_dropout_streams(model, state.dropout)

    try:
        return train_loop(
            model, optimizer, step, seed_dropout, sharded, steps, label_smoothing, callback,
            seed, resumed, save, checkpoint_every, state_of, restore,
        )  # fmt: skip
    finally:
        gather(model)


def _save_sharded(directory: str, model, optimizer: Adam, plan: Plan, state, run: dict) -> None:
    """Step ``state.step``'s sharded checkpoint in ``directory``: process 0 makes the staging
    folder, every process writes its shards into it (``sharded_checkpoint.save``), and once all
    have, process 0 commits it (training.json, then the rename that makes it the step's)."""
    from transformer_run import sharded_checkpoint as folders

    from .sharded_checkpoint import save as save_shards

    across = jax.process_count() > 1
    if jax.process_index() == 0:
        folders.staging(directory, state.step)
    if across:  # the folder made before any process writes into it
        multihost_utils.sync_global_devices(f"sharded checkpoint {state.step}: staged")
    save_shards(folders.step_folder(directory, state.step) + ".partial", model, optimizer)
    maybe_fail("save", state.step, jax.process_index())  # its shards written, not committed
    if across:  # every process's shards written before the commit
        multihost_utils.sync_global_devices(f"sharded checkpoint {state.step}: saved")
    if jax.process_index() == 0:
        folders.commit(directory, "jax", model.config, plan, state, run)
    if across:  # committed before any process goes on (and may read it, or save the next)
        multihost_utils.sync_global_devices(f"sharded checkpoint {state.step}: committed")


def _rows(model, batch: Mapping[str, Any]) -> int:
    return int(np.shape(split_batch(model.config, batch)[1])[0])


# ----------------------------------------------------------------------------- the collectives
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce")
_BYTES = {"f64": 8, "f32": 4, "s64": 8, "s32": 4, "bf16": 2, "f16": 2, "pred": 1, "u32": 4}
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<kind>all-gather|reduce-scatter|all-reduce|"
    r"collective-permute|all-to-all)(?:-start)?\("
)


def hlo_collectives(hlo: str) -> dict[str, dict[str, int]]:
    """The collectives of a compiled program's text (``compiled.as_text()``), by kind: ``count``,
    the tensors they move (one per array, as NumPy's reference counts them), ``bytes``, the whole
    buffers they work on (an all-gather's output, a reduce-scatter's input, an all-reduce's
    buffer), and ``instructions``: XLA's combiners put several tensors into one instruction."""
    counts = {kind: {"count": 0, "bytes": 0, "instructions": 0} for kind in COLLECTIVES}
    for match in _INSTRUCTION.finditer(hlo):
        kind, shape = match["kind"], match["shape"]
        counts.setdefault(kind, {"count": 0, "bytes": 0, "instructions": 0})
        shapes = re.findall(r"([a-z]+\d*)\[([\d,]*)\]", shape)
        if match[0].endswith("-start(") and shape.startswith("(("):
            shapes = shapes[len(shapes) // 2 :]  # an async start's tuple is (operands, results)
        group = 1
        if kind == "reduce-scatter":  # its result is one device's piece of the input
            line = hlo[match.end() : hlo.find("\n", match.end())]
            group = _group_size(line)
        counts[kind]["instructions"] += 1
        counts[kind]["count"] += len(shapes)
        counts[kind]["bytes"] += group * sum(
            _BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
            for dtype, dims in shapes
        )
    return counts


def _group_size(line: str) -> int:
    """The devices in each replica group of an HLO collective's attributes."""
    groups = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if groups:
        return len(groups[1].split(","))
    iota = re.search(r"replica_groups=\[\d+,(\d+)\]", line)
    if iota:
        return int(iota[1])
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if mesh:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh[1]))
        return int(np.prod([int(sizes[axis]) for axis in re.findall(r"'(\w+)'", mesh[2])]))
    raise ValueError(f"no replica groups found in {line[:200]!r}")


def step_collectives(model, batch: Mapping[str, Any], plan: Plan) -> dict[str, dict[str, int]]:
    """The collectives one device runs in one training step (loss, gradients, Adam) under
    ``plan``: ``hlo_collectives`` of the program ``nnx.jit`` compiles for train.py's ``_update``."""
    return hlo_collectives(step_program(model, batch, plan))


def step_program(model, batch: Mapping[str, Any], plan: Plan) -> str:
    """The text of the compiled training step under ``plan``, after XLA's passes: what runs."""
    return _compiled_step(model, batch, plan).as_text()


def step_memory(model, batch: Mapping[str, Any], plan: Plan) -> dict[str, int]:
    """The bytes XLA allocates for one run of one device's compiled training step: ``arguments``
    (its shards of the weights and Adam's moments, its rows of the batch), ``outputs`` (the
    updated ones), ``aliased`` (the outputs written over their donated arguments: the weights and
    moments), ``temporaries`` (whole weights gathered, gradients, activations: one block) and
    ``total``, all of them: arguments + outputs - aliased + temporaries."""
    memory = _compiled_step(model, batch, plan).memory_analysis()
    held = {
        "arguments": int(memory.argument_size_in_bytes),
        "outputs": int(memory.output_size_in_bytes),
        "aliased": int(memory.alias_size_in_bytes),
        "temporaries": int(memory.temp_size_in_bytes),
    }
    held["total"] = held["arguments"] + held["outputs"] - held["aliased"] + held["temporaries"]
    return held


def _compiled_step(model, batch: Mapping[str, Any], plan: Plan):
    check_plan(model.config, plan, _rows(model, batch))
    mesh = sharding_mesh(plan)
    optimizer = Adam(model, lambda step: 1e-3)
    shard_model(model, mesh, plan)
    shard_optimizer(optimizer, mesh, plan)
    training = any(not m.deterministic for _, m in nnx.iter_graph(model) if isinstance(m, Dropout))
    model.train()  # as the training loop sets it (dropout on), with new streams: the program
    seed_dropout(model, 0)  # training runs, compiled once for both
    try:
        inputs, targets = _placed(model, batch, mesh)
        adam = optimizer.optimizer
        return _compile(
            _sharded_update, model, adam, inputs, targets, label_smoothing=0.0, mesh=mesh, plan=plan
        )
    finally:
        if not training:
            model.eval()  # as it came
        gather(model)


# ------------------------------------------------------ tensor parallel: a block in shard_map
class TensorParallelBlock(nnx.Module):
    """One attention or feed-forward block, tensor parallel, wrapped from outside and written out
    with ``jax.shard_map`` over ``model``: inside, the block's own code runs on each device's
    shards (its query and key/value heads, its slice of d_ff; ``split_heads`` reshapes to -1
    heads), and the two communications are Megatron's, written where they happen:

    - "f", at the entrance: each distinct input (self-attention's x; cross-attention's query and
      memory; the feed-forward's x) is marked as varying over ``model`` once (``jax.lax.pcast``).
      Identity in the forward; in the backward its transpose sums the device's parts of that
      input's gradient (w_q's, w_k's and w_v's, added on the device first) over ``model``: one
      all-reduce per distinct input, where GSPMD all-reduces each projection's part;
    - "g", at the exit: ``jax.lax.psum`` of the partial outputs of the row-split w_o, w_2 or
      w_down: one all-reduce. That Linear's bias is added once, after the sum.

    Inside the step's ``shard_map`` over the whole mesh (FSDP, data parallel: ``model`` is manual
    already) the block runs there, on the shards it was given; alone, in its own ``shard_map``
    over ``model``. Dropout inside the block (attention weights, the feed-forward's hidden
    features) draws the one device's mask, of every head or feature, and keeps the device's own
    (``keep_own_heads_or_features``): the single device's masks."""

    def __init__(self, block: nnx.Module, mesh: jax.sharding.Mesh):
        self.block, self.mesh = block, mesh

    def __call__(self, *args):
        attention = hasattr(self.block, "w_q")
        count = 3 if attention else 1  # query, key, value; or x
        need_weights = attention and len(args) > 4 and args[4]
        cache = args[5] if attention and len(args) > 5 else None
        if need_weights or cache is not None:  # each device has only its own heads
            raise ValueError(
                "a tensor-parallel attention block trains: it returns no attention weights and "
                f"keeps no cache; got need_weights={need_weights}, cache={type(cache).__name__}"
            )
        inputs, extra = args[:count], args[count:]
        distinct = []  # the inputs, each tensor once (one all-reduce of its gradient)
        for x in inputs:
            if not any(x is seen for seen in distinct):
                distinct.append(x)
        where = [next(i for i, seen in enumerate(distinct) if x is seen) for x in inputs]
        plan = Plan(tensor_parallel=self.mesh.shape["model"])
        graphdef, params, rest = nnx.split(self.block, nnx.Param, ...)
        specs = jax.tree_util.tree_map_with_path(
            lambda path, w: weight_spec(_canonical(path), w.shape, plan), params
        )
        closing = _closing_linear(self.block)
        bias = None if closing.bias is None else closing.bias[...]  # (d_model,)

        at = [i for i, arg in enumerate(extra) if isinstance(arg, jax.Array)]  # a mask
        arrays = [extra[i] for i in at]

        def local(params, rest, distinct, arrays):  # on each device, its shards
            full = list(extra)
            for i, array in zip(at, arrays, strict=True):
                full[i] = array
            distinct = [jax.lax.pcast(x, "model", to="varying") for x in distinct]  # "f"
            block = nnx.merge(graphdef, params, rest)
            if bias is not None:
                own = _closing_linear(block).bias
                own[...] = jax.numpy.zeros(own.shape, own.dtype)  # added once, after "g"
            # (B, H, T_q, T_k): the device's heads; (B, T, d_ff): its hidden features
            unwrap = keep_own_heads_or_features(block, 1 if attention else -1)
            with fused_kernels(False):  # the block's own code, on this device's shards
                out = block(*[distinct[i] for i in where], *full)
            unwrap()
            partial = out[0] if attention else out  # (B, T, d_model)
            return jax.lax.psum(partial, "model"), nnx.state(block, nnx.Not(nnx.Param))  # "g"

        if "model" in jax.sharding.get_abstract_mesh().manual_axes:
            run = local  # inside FSDP's shard_map: the params are this device's shards already
        else:
            run = jax.shard_map(
                local,
                mesh=self.mesh,
                in_specs=(specs, P(), P(), P()),
                out_specs=(P(), P()),
                axis_names=frozenset({"model"}),
            )
        output, rest = run(params, rest, distinct, arrays)
        if any(_drops(module) for _, module in nnx.iter_graph(self.block)):
            nnx.update(self.block, rest)  # the dropout streams it advanced (only they change)
        if bias is not None:
            output = output + bias  # (B, T, d_model)
        return (output, None) if attention else output


def _closing_linear(block: nnx.Module) -> nnx.Module:
    """The row-split Linear that closes a block: w_o, w_2 or w_down."""
    for name in ("w_o", "w_down", "w_2"):
        if hasattr(block, name):
            return getattr(block, name)
    raise TypeError(f"{type(block).__name__} is not an attention or feed-forward block")


def _drops(module) -> bool:
    """Whether ``module`` is a Dropout that draws masks (training, a rate above 0)."""
    return isinstance(module, Dropout) and not module.deterministic and module.rate > 0


def keep_own_heads_or_features(block: nnx.Module, axis: int) -> Callable[[], None]:
    """Inside a ``TensorParallelBlock``'s ``shard_map``: the block's Dropout (on the attention
    weights, or on the feed-forward's hidden features) a ``WholeMaskDropout`` that keeps the
    device's part along ``axis`` over ``model`` (its heads, or its features), besides its rows
    where the batch is split over ``data``; -> a function that puts it back."""
    dropout = block.dropout
    rows = dropout.parts if isinstance(dropout, WholeMaskDropout) else ()
    inner = dropout.dropout if isinstance(dropout, WholeMaskDropout) else dropout
    block.dropout = WholeMaskDropout(inner, (*rows, (axis, "model")))

    def unwrap():
        block.dropout = dropout

    return unwrap


def tensor_parallel_blocks(layer: nnx.Module, mesh: jax.sharding.Mesh) -> Callable[[], None]:
    """Wrap each attention and feed-forward block of an encoder or decoder ``layer`` in a
    ``TensorParallelBlock`` (none where ``mesh`` has one device along ``model``); -> a function
    that puts them back."""
    wrapped = {}
    for name in ("self_attn", "cross_attn", "ffn") if mesh.shape["model"] > 1 else ():
        block = getattr(layer, name, None)
        if block is not None:
            wrapped[name] = block
            setattr(layer, name, TensorParallelBlock(block, mesh))

    def unwrap():
        for name, block in wrapped.items():
            setattr(layer, name, block)

    return unwrap


def tensor_parallel_block(block: nnx.Module, x: jax.Array, mesh: jax.sharding.Mesh, mask=None):
    """One self-attention (with ``mask``, broadcastable to its scores) or feed-forward block run
    as a ``TensorParallelBlock`` on ``x`` (B, T, d_model) -> (B, T, d_model), whole on every
    device."""
    parallel = TensorParallelBlock(block, mesh)
    return parallel(x, x, x, mask)[0] if hasattr(block, "w_q") else parallel(x)


__all__ = [
    "COMPILER_OPTIONS",
    "ShardedLayer",
    "data_sharded_loss",
    "gather_unit",
    "hlo_collectives",
    "ShardedLayer",
    "shard_batch",
    "shard_model",
    "shard_optimizer",
    "sharded_loss_and_grads",
    "sharded_train",
    "sharding_mesh",
    "step_collectives",
    "step_memory",
    "step_program",
    "TensorParallelBlock",
    "WholeMaskDropout",
    "keep_own_heads_or_features",
    "tensor_parallel_block",
    "tensor_parallel_blocks",
    "weight_spec",
    "wrap_units",
]
