"""JAX's sharded checkpoint: the sharded ``jax.Array``s of the weights and of Adam's moments
written with Orbax as they are placed, each process writing its own devices' shards (one copy of
each: a shard that several devices hold is written by one), and read back into the shards a NEW
plan places, each process reading the pieces of the files its devices need. No device ever holds
a whole weight to save or restore it (unless its plan holds it whole).

In a step's folder (``transformer_run.sharded_checkpoint``: ``staging``, then ``commit``):

    state/      Orbax's checkpoint (``StandardCheckpointer``: TensorStore's OCDBT files, each
                process its own ``ocdbt.process_N``, and Orbax's metadata) of one tree:
                {"weights": {name: weight}, "m": {name: Adam's m}, "v": {name: Adam's v}},
                the canonical names (``transformer_spec.param_schema``) and layout (Flax's
                ``kernel`` is [in, out], the canonical ``weight``'s layout: nothing is
                transposed), so ``whole_tensors`` reads it without building a model.

Orbax records each array's shape, dtype and the sharding it was saved under; ``restore`` asks for
every array with the sharding the new plan gives it (``weight_spec`` on the new mesh: what
``shard_model`` and ``shard_optimizer`` place), and Orbax reads each device's piece of it from the
saved chunks, whatever plan cut them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding

from transformer_run.sharded_checkpoint import TRAINING_FILE, ShardedCheckpoint, read
from transformer_run.sharding import Plan
from transformer_spec import param_schema, parent_of

from .optim import Adam
from .params import _to_flax_name
from .sharding import weight_spec
from .train import _adam_moment_variables, _set_adam_step

STATE = "state"  # Orbax's folder inside a step's folder
MOMENTS = ("m", "v")


def _state_path(folder: str | os.PathLike) -> str:
    """Where Orbax writes in a step's folder: an absolute path (Orbax refuses a relative one)."""
    return os.path.join(os.path.abspath(os.fspath(folder)), STATE)


def _weight_variable(model: nnx.Module, name: str) -> nnx.Variable:
    """The nnx.Param holding the canonical weight ``name``."""
    parent, leaf = parent_of(model, name)
    return getattr(parent, _to_flax_name(parent, leaf))


def _variables(model: nnx.Module, optimizer: Adam) -> dict[str, dict[str, nnx.Variable]]:
    """{"weights" | "m" | "v": {canonical name: its nnx variable}}: what a checkpoint holds."""
    tree: dict[str, dict[str, nnx.Variable]] = {"weights": {}, "m": {}, "v": {}}
    for name in param_schema(model.config, model.schema):
        tree["weights"][name] = _weight_variable(model, name)
        tree["m"][name], tree["v"][name] = _adam_moment_variables(optimizer, name)
    return tree


# speed: bytes Orbax may always have in flight. Bounded to one small tensor, its writes wait on
# each other, one after another: a save of a model of kilobytes took twice the CPU time (0.9 s
# against 0.45); a megabyte more is nothing beside a model's shards.
IN_FLIGHT_FLOOR = 2**20


def save(folder: str | os.PathLike, model: nnx.Module, optimizer: Adam) -> None:
    """Write ``model``'s weights and ``optimizer``'s moments, the arrays as they are placed, into
    ``folder``/state (``folder``: a ``staging`` folder; the caller commits it). Called by every
    process, each writing its own devices' shards; returns once all are written."""
    arrays = {  # the arrays themselves (nnx Variables are pytrees: tree.map would enter them)
        group: {name: variable.get_value() for name, variable in named.items()}
        for group, named in _variables(model, optimizer).items()
    }
    # What Orbax has in flight, bounded to the largest tensor and at least IN_FLIGHT_FLOOR (its
    # default: 96 GB): a process holds its own shards and at most that beside them (the whole
    # model on one device, measured: 1.1-5.5 MB beyond the arrays unbounded, 0.1-0.4 MB bounded).
    largest = max(array.nbytes for named in arrays.values() for array in named.values())
    checkpointer = ocp.StandardCheckpointer(save_concurrent_gb=max(largest, IN_FLIGHT_FLOOR) / 1e9)
    try:
        checkpointer.save(_state_path(folder), arrays)
        checkpointer.wait_until_finished()  # Orbax writes in the background: wait for every file
    finally:
        checkpointer.close()


def _metadata(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Orbax's record of the saved tree: {"weights" | "m" | "v": {name: shape, dtype, ...}}."""
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.metadata(_state_path(folder)).item_metadata.tree


def _check_shapes(folder: str | os.PathLike, schema: dict[str, tuple[int, ...]]) -> None:
    """The saved tensors are the model's, by name and shape: one line naming the first not."""
    saved = _metadata(folder)
    for group in ("weights", *MOMENTS):
        shapes = {name: tuple(meta.shape) for name, meta in saved.get(group, {}).items()}
        if shapes != schema:
            missing = sorted(set(schema) - set(shapes))
            extra = sorted(set(shapes) - set(schema))
            wrong = [n for n in schema if n in shapes and shapes[n] != tuple(schema[n])]
            what = (
                f"missing {missing[0]!r}" if missing
                else f"unexpected {extra[0]!r}" if extra
                else f"{wrong[0]!r} is {shapes[wrong[0]]}, the model's {tuple(schema[wrong[0]])}"
            )  # fmt: skip
            raise ValueError(f"{os.fspath(folder)!r}'s {group} do not fit the model: {what}")


def restore(
    folder: str | os.PathLike,
    model: nnx.Module,
    optimizer: Adam,
    mesh: jax.sharding.Mesh,
    plan: Plan,
    step: int | None = None,
) -> None:
    """Read the weights and Adam's moments saved in ``folder`` (under any plan) into ``model`` and
    ``optimizer`` (Adam on ``model``), each array placed as ``plan`` places it on ``mesh`` (the
    weights by ``weight_spec``, each moment like its weight), and set Adam's step: ``step``, else
    the one ``folder``'s training.json records. Called by every process; each reads its devices'
    pieces. The rest of the model (buffers, dropout streams) is left as it is."""
    schema = param_schema(model.config, model.schema)
    _check_shapes(folder, schema)
    variables = _variables(model, optimizer)
    target = {
        group: {
            name: jax.ShapeDtypeStruct(
                tuple(schema[name]),
                variable[...].dtype,  # the model's: Orbax casts a checkpoint of another dtype
                sharding=NamedSharding(mesh, weight_spec(name, tuple(schema[name]), plan)),
            )
            for name, variable in named.items()
        }
        for group, named in variables.items()
    }
    with ocp.StandardCheckpointer() as checkpointer:
        arrays = checkpointer.restore(_state_path(folder), target)
    for group, named in variables.items():
        for name, variable in named.items():
            variable.set_value(arrays[group][name])  # the array itself, placed by the new plan
    if step is None:
        step = read(folder).state.step
    _set_adam_step(optimizer, step)


def whole_tensors(
    folder: str | os.PathLike | ShardedCheckpoint,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (the weights, Adam's moments) saved in the step's ``folder`` (a ``ShardedCheckpoint``'s),
    whole NumPy arrays under the canonical names, the moments keyed "m.<name>" and "v.<name>"
    (``TrainingState.moments``): read on this process's host, whatever devices saved them; no model
    is built."""
    folder = folder.folder if isinstance(folder, ShardedCheckpoint) else folder
    path = _state_path(folder)
    with ocp.PyTreeCheckpointer() as checkpointer:
        saved = checkpointer.metadata(path).item_metadata.tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
        tree = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    names = list(tree["weights"])  # Orbax's order (sorted); the schema's, where training.json says
    if os.path.isfile(os.path.join(os.fspath(folder), TRAINING_FILE)):
        names = list(param_schema(read(folder).config))
    params = {name: tree["weights"][name] for name in names}
    moments = {f"{which}.{name}": tree[which][name] for name in params for which in MOMENTS}
    return params, moments


__all__ = ["restore", "save", "whole_tensors"]
