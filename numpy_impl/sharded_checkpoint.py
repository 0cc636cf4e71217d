"""The reference's sharded checkpoint: each simulated device writes its own pieces to its own file,
as each process of a real run writes its own shards; a checkpoint saved under one plan is read into
the pieces another plan needs, one weight at a time.

In a step's folder (``transformer_run.sharded_checkpoint``):

    device-R.safetensors   device R's pieces: ``<name>`` (the weight), ``optimizer.m.<name>`` and
                           ``optimizer.v.<name>`` (Adam's moments), in the canonical layout, each
                           the part ``transformer_run.sharding.piece`` cuts for that device

Devices that hold the same pieces (data parallel's replicas) write them once: the devices of data
rank f < fsdp do, R = plan.rank(f, model rank). The plan saved in training.json says how each weight
was cut (``plan_weights``), so reading needs nothing else.

Memory: a device writes its file one tensor at a time (``write_safetensors``: each tensor's bytes,
then the next), so saving holds its own pieces plus one piece's copy; reading under a new plan
holds one whole weight at a time, joined from the saved pieces, while every device cuts its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
from safetensors import safe_open

from transformer_run.faults import maybe_fail
from transformer_run.sharded_checkpoint import ShardedCheckpoint
from transformer_run.sharding import Plan, join, piece, plan_weights
from transformer_spec.config import Config
from transformer_spec.io import FORMAT, write_safetensors

MOMENTS = ("m", "v")


def device_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"device-{rank}.safetensors")


def writers(plan: Plan) -> Iterator[tuple[int, int, int]]:
    """(rank, data rank, model rank) of each device that writes a file: one of each distinct set
    of pieces."""
    for f in range(plan.fsdp):
        for t in range(plan.tensor_parallel):
            yield plan.rank(f, t), f, t


def device_tensors(device) -> dict[str, np.ndarray]:
    """What device R writes: its pieces of the weights and of Adam's moments."""
    tensors = dict(device.params)
    for which in MOMENTS:
        moments = getattr(device, which)
        tensors |= {f"optimizer.{which}.{name}": value for name, value in moments.items()}
    return tensors


def save(folder: str, run) -> None:
    """Every writing device of the ``ShardedRun`` ``run`` writes its file into ``folder`` (one after
    another: a device planned to die in the middle of the save does so once its file is written)."""
    for rank, f, t in writers(run.plan):
        device = run.replicas[f].devices[t]
        write_safetensors(device_file(folder, rank), device_tensors(device), {"format": FORMAT})
        maybe_fail("save", run.t, rank, kill=False)


def whole_tensor(folder: str, config: Config, plan: Plan, name: str) -> np.ndarray:
    """The whole tensor ``name`` (a weight, or ``optimizer.m.<weight>``...) joined from the pieces
    the devices of ``plan`` saved in ``folder``."""
    weight = name.split(".", 2)[2] if name.startswith("optimizer.") else name
    where = plan_weights(config, plan)[weight]
    pieces = {}
    for rank, f, t in writers(plan):
        with safe_open(device_file(folder, rank), framework="numpy") as file:
            pieces[(f, t)] = file.get_tensor(name)
    return join(pieces, where, plan)


def restore(checkpoint: ShardedCheckpoint, run) -> None:
    """Every device of ``run`` (a ``ShardedRun`` under any plan) takes its pieces of the weights and
    of Adam's moments from ``checkpoint`` (saved under its own plan), and Adam its step."""
    if checkpoint.config != run.config:
        raise ValueError(
            "the checkpoint's config is not the model's: a checkpoint resumes the model it saved"
        )
    for name, where in run.weights.items():
        stored_as = [(name, "params")] + [(f"optimizer.{w}.{name}", w) for w in MOMENTS]
        for stored, attribute in stored_as:
            value = whole_tensor(checkpoint.folder, checkpoint.config, checkpoint.plan, stored)
            for d, replica in enumerate(run.replicas):
                for t, device in enumerate(replica.devices):
                    getattr(device, attribute)[name][...] = piece(value, where, run.plan, d, t)
    run.t = checkpoint.state.step


def restore_moments(state, run) -> None:
    """Every device of ``run`` takes its pieces of the whole moments of ``state`` (a
    ``TrainingState``: "m.<name>", "v.<name>"), and Adam its step."""
    for name, where in run.weights.items():
        for which in MOMENTS:
            value = np.asarray(state.moments[f"{which}.{name}"])
            for d, replica in enumerate(run.replicas):
                for t, device in enumerate(replica.devices):
                    getattr(device, which)[name][...] = piece(value, where, run.plan, d, t)
    run.t = state.step


def whole_tensors(
    checkpoint: ShardedCheckpoint,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (weights, moments): whole, canonical names and layout; moments as ``TrainingState``'s
    ("m.<name>", "v.<name>")."""
    params, moments = {}, {}
    for name in plan_weights(checkpoint.config, checkpoint.plan):
        params[name] = whole_tensor(checkpoint.folder, checkpoint.config, checkpoint.plan, name)
        for which in MOMENTS:
            moments[f"{which}.{name}"] = whole_tensor(
                checkpoint.folder, checkpoint.config, checkpoint.plan, f"optimizer.{which}.{name}"
            )
    return params, moments
