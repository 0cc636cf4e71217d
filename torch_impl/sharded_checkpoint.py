"""torch's sharded checkpoint: ``torch.distributed.checkpoint`` (DCP) writes each rank's own shards
of the weights and of Adam's moments (DTensors, as FSDP and tensor parallel left them), and reads a
checkpoint into whatever shards the loading run's plan gives each rank.

One state dict, the same keys under every plan (DCP matches tensors by key and reshards them from
the offsets it recorded at save time):

    weights.<name>   the weight (canonical name), torch's layout (nn.Linear's [out, in])
    m.<name>         Adam's exp_avg, like the weight
    v.<name>         Adam's exp_avg_sq, like the weight

A replicated shard (data parallel's copies, a tensor-parallel row-split bias) is written once (DCP's
planner removes duplicates). ``torch_layout.json`` lists the weights stored transposed, so that
``whole_tensors`` gives the canonical layout without building a model. Adam's step, the
schedule's position, the losses and the dropout streams are in training.json
(``transformer_run.sharded_checkpoint``).

Memory: each rank writes its own local shards, one at a time (DCP's file writer serialises each
tensor into the rank's file); no rank ever holds another's shards or a whole weight.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, distribute_tensor

from transformer_run.sharded_checkpoint import ShardedCheckpoint
from transformer_spec import param_schema, parent_of

from .optim import Adam
from .train import _set_adam_step

LAYOUT_FILE = "torch_layout.json"
STATE = "state"  # the folder DCP writes into, inside a step's folder


def _transposed(model, name: str) -> bool:
    parent, leaf = parent_of(model, name)
    return isinstance(parent, torch.nn.Linear) and leaf == "weight"


def state_dict(model, optimizer: Adam) -> dict[str, torch.Tensor]:
    """{key: this rank's tensor (a DTensor where it is sharded)}: the weights and Adam's moments,
    created as zeros where Adam has not stepped yet (they are read into)."""
    state = {}
    for name in param_schema(model.config, model.schema):
        parent, leaf = parent_of(model, name)
        parameter = getattr(parent, leaf)
        adam = optimizer.optimizer.state[parameter]
        if "exp_avg" not in adam:
            adam["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            adam["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            adam["step"] = torch.tensor(0.0)
        weight = parameter if isinstance(parameter, DTensor) else parameter.data
        state[f"weights.{name}"] = weight
        state[f"m.{name}"], state[f"v.{name}"] = adam["exp_avg"], adam["exp_avg_sq"]
    return state


def save(folder: str, model, optimizer: Adam) -> None:
    """Every rank calls this (a collective): its shards into ``folder``."""
    with torch.no_grad():
        dcp.save(state_dict(model, optimizer), checkpoint_id=os.path.join(folder, STATE))
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        names = [n for n in param_schema(model.config, model.schema) if _transposed(model, n)]
        with open(os.path.join(folder, LAYOUT_FILE), "w", encoding="utf-8") as f:
            json.dump(names, f)


def restore(checkpoint: ShardedCheckpoint, model, optimizer: Adam) -> None:
    """Every rank calls this: its shards of the weights and moments, under ITS plan, read from a
    checkpoint saved under any plan; Adam's step and the schedule's position."""
    if checkpoint.config != model.config:
        raise ValueError(
            "the checkpoint's config is not the model's: a checkpoint resumes the model it saved"
        )
    with torch.no_grad():
        dcp.load(state_dict(model, optimizer), checkpoint_id=os.path.join(checkpoint.folder, STATE))
    _set_adam_step(optimizer, checkpoint.state.step)


def restore_moments(state, model, optimizer: Adam) -> None:
    """Every rank cuts its shards of the whole moments of ``state`` (a ``TrainingState``:
    "m.<name>", "v.<name>", canonical layout) as its weights are cut; Adam's step and the
    schedule's position."""
    for name in param_schema(model.config, model.schema):
        m, v = state.moments[f"m.{name}"], state.moments[f"v.{name}"]
        parent, leaf = parent_of(model, name)
        parameter = getattr(parent, leaf)
        moments = []
        for value in (m, v):
            value = value.T if _transposed(model, name) else value  # torch's layout
            value = torch.tensor(np.ascontiguousarray(value), dtype=parameter.dtype)
            if isinstance(parameter, DTensor):  # this rank's shard, as the weight's
                value = distribute_tensor(value, parameter.device_mesh, parameter.placements)
            moments.append(value.to(parameter.device))
        optimizer.optimizer.state[parameter] = {"exp_avg": moments[0], "exp_avg_sq": moments[1]}
    _set_adam_step(optimizer, state.step)


def whole_tensors(
    checkpoint: ShardedCheckpoint,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (weights, moments ``m.<name>``/``v.<name>``): whole, canonical names and layout, read in
    this one process (no process group)."""
    path = os.path.join(checkpoint.folder, STATE)
    metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {
        key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in metadata.items()
    }
    with warnings.catch_warnings():  # that there is no process group: none is meant
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=True)
    with open(os.path.join(checkpoint.folder, LAYOUT_FILE), encoding="utf-8") as f:
        transposed = set(json.load(f))
    params, moments = {}, {}
    for name in param_schema(checkpoint.config):
        stored = {f"weights.{name}": (params, name), f"m.{name}": (moments, f"m.{name}")}
        stored[f"v.{name}"] = (moments, f"v.{name}")
        for key, (into, canonical) in stored.items():
            value = state[key].numpy()
            into[canonical] = np.ascontiguousarray(value.T if name in transposed else value)
    return params, moments
