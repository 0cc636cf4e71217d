"""Sharded training, the backend-neutral part: the plan (how many ways each strategy splits), which
weight is split how, and the checks that refuse a plan that cannot work before any process starts.

A plan has three degrees; the devices are their product, laid out as a mesh of two axes:

    data  = data_parallel * fsdp   each takes its own rows of the global batch (as data_parallel.py)
    model = tensor_parallel        each takes its own heads and its own slice of d_ff

    device (rank) = data_rank * tensor_parallel + model_rank

Along ``data`` the weights are either whole on every device (``data_parallel``: the gradients are
all-reduced) or split (``fsdp``, fully sharded data parallel: each device keeps 1/N of every weight,
its gradient and its Adam moments; a layer's weights are all-gathered just before it runs, in the
forward and again in the backward, and its gradients are reduce-scattered). One of the two at a
time: both engines have one data axis (torch's 2-D mesh, JAX's ``("data", "model")`` mesh).

Along ``model``, Megatron's tensor parallelism (Shoeybi et al., 2019) pairs the matrices of each
block. The ones that open a block's inner width are split by output columns: w_q, w_k, w_v (each
rank computes num_heads / K query heads and num_kv_heads / K key/value heads; a query head's shared
key/value head of grouped-query attention is on the same rank, because both are split in order),
and w_1 (or w_gate and w_up) of the feed-forward (each rank computes d_ff / K hidden features). The
one that closes the block is split by input rows: w_o, and w_2 (or w_down). Each rank's partial
output is summed over ``model``: one all-reduce after the row-split matmul in the forward, and one
for the gradient of the block's input in the backward (every rank computed a part of it from its
own heads). A column-split layer's bias is split like its columns; a row-split layer's bias is
whole, added once after the sum. Everything else (embeddings, norms, the output projection, the
pooler) is whole on every model rank, computed the same on each: their gradients need no exchange.

FSDP splits, of every weight, the first dimension that tensor parallelism leaves whole: a matrix's
rows [in, out] (a row-split one's columns instead), an embedding table's rows (its vocabulary), a
norm's or a bias's one dimension (a column-split bias has none left: each model rank's part of it is
split again over ``data``, as torch's ``fully_shard`` does on top of a tensor-parallel weight).
It must divide that dimension, as JAX's ``NamedSharding`` requires (torch's ``fully_shard`` would
pad instead): ``check_plan`` refuses a plan that does not, naming the weight and both numbers; for
a column-split bias, the number is the size of its part on one model rank. The
units FSDP gathers at once (``fsdp_units``) are each encoder and decoder layer, and the rest of the
model (embeddings, final norms, output projection) as one last unit, as ``fully_shard`` is applied
to each layer and then to the whole model.

Every backend has the same entry points in ``<backend>_impl/sharding.py``:

    sharded_train(model, batches, steps, schedule, label_smoothing=0.0, callback=None, seed=0, *,
                  plan, checkpoint=None, checkpoint_every=0, checkpoint_dir=None, resume=None,
                  run_record=None) -> losses
        ``train`` with this plan; ``checkpoint(state)`` receives whole tensors under the canonical
        names (``TrainingState``); ``checkpoint_dir``: a sharded checkpoint there instead, each
        device writing its own shards in its framework's format (``sharded_checkpoint``);
        ``resume``: such a checkpoint of the same framework saved under any plan, or a whole
        ``TrainingState`` (a checkpoint file's, any backend's) whose weights the model holds.
    sharded_loss_and_grads(model, batch, plan, label_smoothing=0.0) -> (loss, {name: whole gradient})
        one forward and backward over the devices; the model is not changed.
    step_collectives(model, batch, plan) -> {kind: {"count": n, "bytes": b}}
        the collectives one device runs in one training step, by kind ("all-gather",
        "reduce-scatter", "all-reduce"); bytes: the whole buffer each one works on (an all-gather's
        output, a reduce-scatter's input). NumPy's are the reference the engines are compared with.

Dropout: every device draws the one device's mask of the whole activation, from the one device's
stream where it stands, and keeps its own part: its rows along ``data``; along ``model``, its heads
of the attention weights and its hidden features of the feed-forward, and the whole width where the
activation is the same on every model rank (the embeddings' and each sub-layer's output). So with
dropout too a sharded run is the single-device run with the same seed, and a checkpoint's dropout
streams are one device's (each backend's ``WholeMaskDropout``; NumPy's ``step_dropout_draws``
counts the random numbers a device draws for it: every number one device draws).

NumPy simulates the devices in one process (numpy_impl/sharding.py writes out every collective);
torch runs one process per device (gloo on the CPU, nccl on GPUs); JAX places the arrays on a
device mesh (simulated CPU devices where there are fewer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from transformer_spec.config import Config
from transformer_spec.schema import param_schema

# Megatron's pairs: the layers whose output columns are split over ``model`` and those whose input
# rows are (their partial outputs summed by one all-reduce).
COLUMN_SPLIT = ("w_q", "w_k", "w_v", "w_1", "w_gate", "w_up")
ROW_SPLIT = ("w_o", "w_2", "w_down")
COLUMN, ROW = "column", "row"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How many ways each strategy splits; devices = data_parallel * fsdp * tensor_parallel."""

    data_parallel: int = 1
    fsdp: int = 1
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        for name in ("data_parallel", "fsdp", "tensor_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive number of devices, got {value!r}")
        if self.data_parallel > 1 and self.fsdp > 1:
            raise ValueError(
                f"data_parallel {self.data_parallel} with fsdp {self.fsdp}: the mesh has one data axis, "
                "whose devices hold either whole weights or shards: choose one"
            )

    @property
    def devices(self) -> int:
        return self.data_parallel * self.fsdp * self.tensor_parallel

    @property
    def data(self) -> int:
        """Devices along ``data``: each takes 1/data of the batch's rows."""
        return self.data_parallel * self.fsdp

    def rank(self, data_rank: int, model_rank: int) -> int:
        """The device at (data_rank, model_rank) of the mesh."""
        return data_rank * self.tensor_parallel + model_rank


class Placement(NamedTuple):
    """How one weight is split. ``tensor_parallel``: "column", "row" or None (whole on every model
    rank); ``model_dim``: the dimension split over ``model`` (None: none); ``fsdp_dim``: the one FSDP
    splits over ``data`` (None: none)."""

    tensor_parallel: str | None
    model_dim: int | None
    fsdp_dim: int | None


def placement(name: str, shape: tuple[int, ...], plan: Plan) -> Placement:
    """Where the canonical weight ``name`` of ``shape`` ([in, out] for a matrix) lives under ``plan``
    (see the module docstring)."""
    parts = name.split(".")
    layer, leaf = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[-1])
    split, model_dim = None, None
    if plan.tensor_parallel > 1:
        if layer in COLUMN_SPLIT:
            split, model_dim = COLUMN, len(shape) - 1  # weight (in, out): the columns; bias (out,)
        elif layer in ROW_SPLIT and leaf == "weight":
            split, model_dim = ROW, 0  # weight (in, out): the rows
        elif layer in ROW_SPLIT:
            split = ROW  # its bias: whole, added once after the sum
    fsdp_dim = None
    if plan.fsdp > 1:
        # the first dimension ``model`` leaves whole; a column-split bias has none: its one dimension,
        # split over ``model`` first, then each part over ``data``
        fsdp_dim = next((axis for axis in range(len(shape)) if axis != model_dim), model_dim)
    return Placement(split, model_dim, fsdp_dim)


def plan_weights(config: Config, plan: Plan) -> dict[str, Placement]:
    """{canonical name: Placement} for every weight of the model ``config`` describes."""
    return {name: placement(name, shape, plan) for name, shape in param_schema(config).items()}


def check_plan(config: Config, plan: Plan, batch_rows: int | None = None, devices: int | None = None) -> None:
    """ValueError (one line naming both numbers) unless ``plan`` can run ``config``: tensor_parallel
    divides num_heads, num_kv_heads and d_ff; every split ``piece`` makes of every weight is even
    (tensor parallel's, then FSDP's of the part tensor parallel left: the vocabulary of an embedding
    table, d_model, a model rank's part of a column-split bias, ...); the batch's rows split over
    the data axis; and, when ``devices`` is given, the plan uses exactly that many."""
    k = plan.tensor_parallel
    if k > 1:
        for field in ("num_heads", "num_kv_heads", "d_ff"):
            if getattr(config, field) % k:
                raise ValueError(f"tensor_parallel {k} does not divide {field} {getattr(config, field)}")
    for name, shape in param_schema(config).items():
        _check_pieces(name, shape, placement(name, shape, plan), plan)
    if batch_rows is not None and (batch_rows < plan.data or batch_rows % plan.data):
        raise ValueError(
            f"a batch of {batch_rows} rows does not split evenly over {plan.data} data devices "
            f"(data_parallel {plan.data_parallel} x fsdp {plan.fsdp})"
        )
    if devices is not None and devices != plan.devices:
        raise ValueError(
            f"the plan needs data_parallel {plan.data_parallel} x fsdp {plan.fsdp} x tensor_parallel {k} = "
            f"{plan.devices} devices, but {devices} are there"
        )


def _check_pieces(name: str, shape: tuple[int, ...], where: Placement, plan: Plan) -> None:
    """ValueError unless each split ``piece`` makes of the weight ``name`` is even, checked in the
    order it cuts: tensor parallel's, then FSDP's of the part tensor parallel left (a column-split
    bias is cut twice along its one dimension: d_ff 42 over 2 model ranks leaves 21, which FSDP
    cannot halve though it halves 42). The message names the weight, the split, the size it meets
    and the cut before it."""
    part, before = tuple(shape), ""
    for split, degree, axis in (("tensor_parallel", plan.tensor_parallel, where.model_dim),
                                ("fsdp", plan.fsdp, where.fsdp_dim)):  # fmt: skip
        if axis is None:
            continue
        if part[axis] % degree:
            what = "the vocabulary, " if name.endswith("token.weight") and axis == 0 else ""
            raise ValueError(
                f"{split} {degree} does not divide {part[axis]}, {what}dimension {axis} of {name} {tuple(shape)}"
                f"{before}"
            )
        part = part[:axis] + (part[axis] // degree,) + part[axis + 1 :]
        before = f" after {split} {degree} cut it to {part}"


def plan_for_devices(devices: int, fsdp: int = 1, tensor_parallel: int = 1) -> Plan:
    """The plan that fills ``devices`` (a torchrun world, say): FSDP over ``fsdp``, tensor parallel
    over ``tensor_parallel``, and data parallel over what is left; refused unless they divide it."""
    if devices % (fsdp * tensor_parallel):
        raise ValueError(
            f"fsdp {fsdp} x tensor_parallel {tensor_parallel} = {fsdp * tensor_parallel} does not divide "
            f"{devices} devices"
        )
    return Plan(data_parallel=devices // (fsdp * tensor_parallel), fsdp=fsdp, tensor_parallel=tensor_parallel)


def fsdp_units(config: Config) -> list[tuple[str, list[str]]]:
    """[(unit, its weights' canonical names)]: each encoder layer, each decoder layer, then the rest
    ("" : embeddings, final norms, output projection), in the order the forward first uses them
    (the rest's embeddings come first, but it is gathered once for the whole step)."""
    names = list(param_schema(config))
    layers = [f"encoder.layers.{i}" for i in range(config.num_encoder_layers if config.uses_encoder else 0)]
    layers += [f"decoder.layers.{i}" for i in range(config.num_decoder_layers if config.uses_decoder else 0)]
    units = [(layer, [n for n in names if n.startswith(layer + ".")]) for layer in layers]
    in_layers = {n for _, unit in units for n in unit}
    return [*units, ("", [n for n in names if n not in in_layers])]


# ---------------------------------------------------------------------------- pieces of a weight
def piece(whole: np.ndarray, where: Placement, plan: Plan, data_rank: int, model_rank: int) -> np.ndarray:
    """The part of the ``whole`` weight that device (data_rank, model_rank) keeps (a copy)."""
    part = whole
    if where.model_dim is not None:
        part = np.split(part, plan.tensor_parallel, axis=where.model_dim)[model_rank]
    if where.fsdp_dim is not None:
        part = np.split(part, plan.fsdp, axis=where.fsdp_dim)[data_rank % plan.fsdp]
    return np.array(part)


def join(pieces: Mapping[tuple[int, int], np.ndarray], where: Placement, plan: Plan) -> np.ndarray:
    """The whole weight from its pieces {(data_rank, model_rank): piece} (those of data replica 0
    are read: the others hold the same)."""
    columns = []
    for model_rank in range(plan.tensor_parallel if where.model_dim is not None else 1):
        parts = [pieces[(f, model_rank)] for f in range(plan.fsdp if where.fsdp_dim is not None else 1)]
        columns.append(np.concatenate(parts, axis=where.fsdp_dim) if where.fsdp_dim is not None else parts[0])
    return np.concatenate(columns, axis=where.model_dim) if where.model_dim is not None else columns[0]
