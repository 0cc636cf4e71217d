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
Adam, one program compiled by ``nnx.jit``, ahead of time with ``COMPILER_OPTIONS``) on a copy of the
model made for the plan (``fully_sharded``): with FSDP each encoder and decoder layer is wrapped,
from outside, in a ``FullyShardedLayer``, which gathers that layer's weights whole along ``data``
when its input exists, gathers them again when its gradient arrives, and cuts each weight's gradient
to its shard before the layer below runs, as torch's ``fully_shard`` does per layer; the other
weights are asked for whole along ``data`` (``with_whole_weights``). With tensor parallel each
attention and feed-forward block is wrapped, from outside, in a ``TensorParallelBlock``: the block's
own code in ``jax.shard_map`` over ``model``, on each device's shards, with Megatron's two
communications written out (``pcast`` at the entrance, whose transpose all-reduces the input's
gradient once; ``psum`` at the exit). XLA's SPMD partitioner (GSPMD) reads the weights' and the
batch's shardings and puts in the rest: the all-gathers of FSDP, the gradients' reductions
(``step_collectives`` lists them from the compiled program; the test of the collectives says how and
why they differ from NumPy's written-out step).

Adam's moments are sharded like their weights (``shard_optimizer``); each device updates its
shards. What a device holds at its peak is XLA's plan (``step_memory``). On the CPU it needs two
compiler options for FSDP's memory (``COMPILER_OPTIONS``): its default schedule runs every
layer's second gather at the start of the backward, and its all-reduce combiner packs all the
gradients' reductions into one at the end, each keeping a whole copy alive. The step donates the
weights and moments, so that they are updated in place (without, the updated ones are new buffers
beside the old: a second copy). With both, FSDP over 4 devices allocates 0.29 of one device's
weights, gradients and moments for a step of the twelve-layer test case at d_model 576 (arguments,
outputs and temporaries, activations included); at d_model 72 XLA's fixed temporaries are a larger
share (0.44; NumPy's written-out step, which counts no activations: 0.28). The CPU compiler has no
reduce-scatter: each gradient is all-reduced whole, then sliced.

A checkpoint is written from whole tensors (``to_params`` and ``training_state`` copy each
array off the devices, which joins its shards), under the canonical names, so it loads into one
device and into every backend.

Devices: as data_parallel.py's (``XLA_FLAGS=--xla_force_host_platform_device_count=N`` on a CPU,
set before JAX starts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_run.batches import split_batch
from transformer_run.sharding import Plan, check_plan, placement
from transformer_run.train import train_loop
from transformer_spec.checks import inputs_checked

from .checks import check_token_ids
from .kernels import fused_kernels
from .layers import Dropout, seed_dropout
from .loss import cross_entropy
from .mixed_precision import keep_random_streams
from .optim import Adam
from .params import to_params
from .train import restore_training_state, training_state


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
    if len(devices) < plan.devices:
        devices = jax.devices("cpu")
    if len(devices) < plan.devices:
        raise ValueError(
            f"the plan needs {plan.devices} devices; JAX sees {len(devices)}: on a CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={plan.devices} before importing jax"
        )
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
    nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(mesh, P())))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.device_put(params, weight_shardings(model, mesh, plan)))


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
    nnx.update(optimizer.optimizer, jax.device_put(state, shardings))


def shard_batch(batch: Mapping[str, Any], mesh: jax.sharding.Mesh) -> dict:
    """Each array of ``batch`` split by rows over ``data``, whole over ``model``."""
    rows = NamedSharding(mesh, P("data"))
    return {key: jax.device_put(np.asarray(x), rows) for key, x in batch.items()}


def gather(module: nnx.Module) -> None:
    """Back to one device (the default one), every array whole."""
    nnx.update(module, jax.device_put(nnx.state(module), jax.devices()[0]))


# ----------------------------------------------------------------------------- training
def with_whole_weights(
    model: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan, skip_layers: bool = False
) -> nnx.Module:
    """Inside a jitted step: a copy of ``model`` whose weights are whole along ``data`` (still
    split along ``model``), so that XLA all-gathers each FSDP-sharded weight before its layer
    uses it; the transpose of that gather reduces the gradient and scatters it back to the shards.
    ``skip_layers``: the encoder's and decoder's layers left as they are (``fully_sharded``
    gathers them one at a time).

    Without it GSPMD is free to move the activations instead of the weights (it split the
    batch's d_model over ``data`` and exchanged activations with all-to-alls: the same numbers,
    but not FSDP). With ``fsdp`` 1 it changes nothing: the weights are already so."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def whole_along_data(path, x):
        if skip_layers and "layers" in _keys(path):
            return x
        return _whole(x, _canonical(path), mesh, plan)

    params = jax.tree_util.tree_map_with_path(whole_along_data, params)
    return nnx.merge(graphdef, params, rest)


def _whole(x: jax.Array, name: str, mesh: jax.sharding.Mesh, plan: Plan) -> jax.Array:
    """The weight ``name`` asked for whole along ``data`` (an all-gather where FSDP split it)."""
    if placement(name, x.shape, plan).fsdp_dim is None:
        return x  # not split over "data" (a column-split bias): as it is
    spec = weight_spec(name, x.shape, Plan(tensor_parallel=plan.tensor_parallel))  # "model" only
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# ---------------------------------------------------------------- FSDP: one layer at a time
class FullyShardedLayer(nnx.Module):
    """One encoder or decoder layer as an FSDP unit, wrapped from outside (the layer's own code
    is unchanged), as torch's ``fully_shard`` wraps each layer:

    - forward: the layer's weights are gathered whole along ``data`` only once the layer's input
      exists (an optimization barrier ties the shards to it, so the gathers are not all hoisted
      to the start), used, and dropped: only the shards and the layer's input are saved;
    - backward: the weights are gathered again once the gradient from the layer above arrives
      (tied to it, so XLA cannot reuse the forward's gather and keep it alive in between), the
      layer's forward is recomputed for its backward, and each weight's gradient, whole on every
      device and partial (its rows of the batch), is summed over ``data`` and cut to the
      device's shard at once, before the layer below runs.

    So a device holds its shards, one layer's whole weights and gradients, and the gradient
    shards of the layers done, where gathering the whole model at the top of the step keeps
    every whole weight from the forward to the backward and every whole gradient until Adam."""

    def __init__(self, layer: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan):
        self.layer, self.mesh, self.plan = layer, mesh, plan

    def __call__(self, x: jax.Array, *args):
        graphdef, params, rest = nnx.split(self.layer, nnx.Param, ...)
        named, treedef = jax.tree_util.tree_flatten_with_path(params)
        shards = [weight for _, weight in named]
        names = [_canonical(path) for path, _ in named]
        specs = [
            weight_spec(name, w.shape, self.plan) for name, w in zip(names, shards, strict=True)
        ]
        at = [i for i, arg in enumerate(args) if isinstance(arg, jax.Array)]  # masks, memory

        def forward(weights, x, arrays, rest):  # the layer, on given weights and arrays
            full = list(args)
            for i, array in zip(at, arrays, strict=True):
                full[i] = array
            # the streams as new variables of this trace (the backward's recomputation advances
            # them from the state they had before the forward: the forward's masks again)
            rest = jax.tree.map(lambda value: value, rest)
            layer = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, weights), rest)
            unwrap = tensor_parallel_blocks(layer, self.mesh)  # with tensor parallel
            out = layer(x, *full)
            unwrap()
            return out, nnx.state(layer, nnx.Not(nnx.Param))  # the streams it advanced

        def gathered(weights, after):
            weights, _ = jax.lax.optimization_barrier((weights, after))  # not before ``after``
            return [
                _whole(w, name, self.mesh, self.plan)
                for w, name in zip(weights, names, strict=True)
            ]

        def to_shards(gradients):  # summed over "data" and cut to this device's shard
            return [
                jax.lax.with_sharding_constraint(g, NamedSharding(self.mesh, spec))
                for g, spec in zip(gradients, specs, strict=True)
            ]

        @jax.custom_vjp
        def run(weights, x, arrays, rest):
            return forward(gathered(weights, x), x, arrays, rest)

        def run_forward(weights, x, arrays, rest):
            return run(weights, x, arrays, rest), (weights, x, arrays, rest)

        def run_backward(saved, cotangents):
            weights, x, arrays, rest = saved
            d_out, _ = cotangents
            whole = gathered(weights, d_out)  # gathered again, now that the gradient is here
            _, pullback = jax.vjp(lambda w, x, a: forward(w, x, a, rest)[0], whole, x, arrays)
            d_weights, d_x, d_arrays = pullback(d_out)
            return to_shards(d_weights), d_x, d_arrays, jax.tree.map(_no_gradient, rest)

        run.defvjp(run_forward, run_backward)
        out, streams = run(shards, x, tuple(args[i] for i in at), rest)
        nnx.update(self.layer, streams)
        return out


def _no_gradient(x: jax.Array):
    """The zero cotangent of a non-trainable input (a buffer, a random stream's key or count)."""
    if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact):
        return jax.numpy.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def fully_sharded(
    model: nnx.Module, mesh: jax.sharding.Mesh, plan: Plan
) -> tuple[nnx.Module, Callable]:
    """Inside a jitted step: a copy of ``model`` for the plan's forward pass: with FSDP, each
    encoder and decoder layer a ``FullyShardedLayer`` and the other weights (embeddings, final
    norms, output projection) whole along ``data``; without, ``with_whole_weights``; with tensor
    parallel, each attention and feed-forward block a ``TensorParallelBlock`` (under FSDP, the
    layer's unit wraps its blocks when it runs). -> (the copy, a function that puts the layers
    and blocks back, to be called after the forward)."""
    whole = with_whole_weights(model, mesh, plan, skip_layers=plan.fsdp > 1)
    stacks = [
        getattr(whole, name)
        for name in ("encoder", "decoder")
        if getattr(whole, name, None) is not None
    ]
    blocks = []  # their unwrap functions
    if plan.fsdp > 1:
        for stack in stacks:
            units = [FullyShardedLayer(layer, mesh, plan) for layer in stack.layers]
            stack.layers = nnx.List(units)
    else:
        blocks = [tensor_parallel_blocks(layer, mesh) for stack in stacks for layer in stack.layers]

    def unwrap():
        for unwrap_blocks in blocks:
            unwrap_blocks()
        for stack in stacks:
            if plan.fsdp > 1:
                stack.layers = nnx.List([unit.layer for unit in stack.layers])

    return whole, unwrap


def _loss(model, inputs: tuple, targets, label_smoothing: float, mesh, plan: Plan):
    whole, unwrap = fully_sharded(model, mesh, plan)
    with inputs_checked():  # checked eagerly, before the jit
        logits = whole(*inputs).logits  # (B, T, V), the batch's rows split over "data"
    unwrap()
    keep_random_streams(model, whole)  # the dropout streams it advanced
    return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()


# XLA's CPU compiler, told to plan for memory: its default schedule runs independent work early
# (every layer's gather at the start of the backward), and its all-reduce combiner packs the
# gradients' reductions into one at the end of the backward, so every whole gradient is alive at
# once. Both are settings of the CPU compiler (an xla_cpu_ option, a pass of the CPU pipeline).
COMPILER_OPTIONS = {
    "xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
    "xla_disable_hlo_passes": "cpu-all-reduce-combiner",
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


def _compile(step, *args, label_smoothing: float, mesh, plan: Plan):
    """``step`` (one of the two above) compiled ahead of time with ``COMPILER_OPTIONS``: the
    compiled program is called with the same nnx objects and arrays, without the static ones."""
    lowered = step.lower(*args, label_smoothing, mesh, plan)
    return lowered.compile(compiler_options=COMPILER_OPTIONS)


def _checked(model, batch: Mapping[str, Any]) -> tuple[tuple, jax.Array]:
    """The batch's inputs and targets, checked eagerly (inside jit their values are unknown)."""
    inputs, targets = split_batch(model.config, batch)
    model.check_inputs(*inputs)
    check_token_ids("targets", targets, model.config.tgt_vocab_size, None)
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
        inputs, targets = _checked(model, shard_batch(batch, mesh))
        step = _compile(_sharded_loss_and_grads, model, inputs, targets,
                        label_smoothing=label_smoothing, mesh=mesh, plan=plan)  # fmt: skip
        loss, grads = step(model, inputs, targets)
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
) -> list[float]:
    """``train`` with the weights and Adam's moments sharded by ``plan``; the loop is
    ``transformer_run.train``'s (its ``checkpoint(state)`` receives whole tensors under the
    canonical names)."""
    for batch in batches:
        check_plan(model.config, plan, _rows(model, batch))
    mesh = sharding_mesh(plan)
    optimizer = Adam(model, schedule)
    shard_model(model, mesh, plan)
    shard_optimizer(optimizer, mesh, plan)
    sharded = [shard_batch(batch, mesh) for batch in batches]  # placed once, read every pass
    programs: dict[tuple, Any] = {}  # compiled once for each shape of batch (and smoothing)

    def step(model, optimizer: Adam, batch, label_smoothing: float = 0.0) -> float:
        inputs, targets = _checked(model, batch)
        optimizer.set_learning_rate()
        adam = optimizer.optimizer
        key = (tuple(np.shape(x) for x in jax.tree.leaves((inputs, targets))), label_smoothing)
        if key not in programs:
            programs[key] = _compile(
                _sharded_update, model, adam, inputs, targets,
                label_smoothing=label_smoothing, mesh=mesh, plan=plan,
            )  # fmt: skip
        return float(programs[key](model, adam, inputs, targets))

    try:
        return train_loop(
            model, optimizer, step, seed_dropout, sharded, steps, label_smoothing, callback,
            seed, None, checkpoint, checkpoint_every, training_state, restore_training_state,
        )  # fmt: skip
    finally:
        gather(model)


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
    try:
        inputs, targets = _checked(model, shard_batch(batch, mesh))
        adam = optimizer.optimizer
        return _compile(
            _sharded_update, model, adam, inputs, targets, label_smoothing=0.0, mesh=mesh, plan=plan
        )
    finally:
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

    The ``data`` axis (the batch's rows, FSDP's gathers) stays GSPMD's. Dropout inside the block
    (attention weights, the feed-forward's hidden features) draws each device's masks for its own
    heads or features from its stream folded with the device's index along ``model``: independent
    masks, not the single device's."""

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
            streams = _fold_streams(block, jax.lax.axis_index("model"))
            with fused_kernels(False):  # the block's own code, on this device's shards
                out = block(*[distinct[i] for i in where], *full)
            partial = out[0] if attention else out  # (B, T, d_model)
            for stream, key in streams:  # the streams' own keys back (their counts advanced)
                stream.key[...] = key
            return jax.lax.psum(partial, "model"), nnx.state(block, nnx.Not(nnx.Param))  # "g"

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


def _fold_streams(block: nnx.Module, index: jax.Array) -> list:
    """Each stream of ``block``'s Dropouts that draw masks keyed by its key folded with ``index``;
    -> [(stream, its own key)], to put back."""
    streams = []
    for _, module in nnx.iter_graph(block):
        if _drops(module):
            key = module.rngs.key[...]
            module.rngs.key[...] = jax.random.fold_in(key, index)
            streams.append((module.rngs, key))
    return streams


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
    "FullyShardedLayer",
    "fully_sharded",
    "hlo_collectives",
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
    "tensor_parallel_block",
    "tensor_parallel_blocks",
    "weight_spec",
    "with_whole_weights",
]
