"""Sharded checkpoints: every device writes its own pieces, in its framework's own format, and no
device ever holds the whole model to save it; a checkpoint saved under one plan resumes under
another (or on one device, or in another framework through ``consolidate``).

A run's checkpoint folder holds one folder per saved step:

    DIR/step-00000010/           a complete checkpoint
        training.json            what is not a tensor: the framework, the config, the plan it was
                                 saved under, Adam's step (the schedule's position, and the data's:
                                 a step's batch is chosen by its number), the loss of every step,
                                 the dropout streams, and the run's settings
        ...                      the tensors, in the framework's own format:
                                 numpy: device-R.safetensors, device R's pieces (the plan's layout);
                                 torch: torch.distributed.checkpoint's files (each rank its shards);
                                 jax:   Orbax's (each process its devices' shards)
    DIR/step-00000020.partial/   being written, or left by a run killed while saving: never read

A save writes into ``step-N.partial``; when every device has written its part, one process writes
training.json and renames the folder to ``step-N`` (``os.rename``: atomic, so a reader, or a run
restarted at any moment, finds a step's checkpoint whole or not at all). ``latest`` is the newest
``step-N``; older ones are removed once a newer one is committed (the last ``KEEP`` stay).

Resharding: each framework reads a checkpoint into the pieces ITS plan needs: torch's
``torch.distributed.checkpoint`` and Orbax do it from the shards' recorded offsets, NumPy's
reference joins one weight at a time from the pieces the saved layout says and cuts its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shutil
from typing import Any

from transformer_spec.checks import WeightsFileError
from transformer_spec.config import Config

from .sharding import Plan, check_plan
from .train import TrainingState

FORMAT = "transformer-three-ways sharded checkpoint 1"
TRAINING_FILE = "training.json"
FRAMEWORKS = ("numpy", "torch", "jax")
KEEP = 2  # committed steps kept in a run's folder
_STEP = re.compile(r"step-(\d{8})")


@dataclasses.dataclass
class ShardedCheckpoint:
    """One committed step's checkpoint (its tensors stay in ``folder``, in ``framework``'s format)."""

    folder: str
    framework: str
    config: Config
    plan: Plan
    state: TrainingState  # step, losses and dropout streams; ``moments`` empty: they are in the shards
    run: dict[str, Any]


def step_folder(directory: str | os.PathLike, step: int) -> str:
    return os.path.join(os.fspath(directory), f"step-{step:08d}")


def partial_folder(directory: str | os.PathLike, step: int) -> str:
    """Where step ``step``'s checkpoint is written before it is committed."""
    return step_folder(directory, step) + ".partial"


def staging(directory: str | os.PathLike, step: int) -> str:
    """The folder the devices write step ``step``'s checkpoint into, created empty (a leftover of a
    run killed while saving it is removed first). Called by one process, before the others write."""
    partial = partial_folder(directory, step)
    if os.path.exists(partial):
        shutil.rmtree(partial)
    os.makedirs(partial)
    return partial


def commit(
    directory: str | os.PathLike,
    framework: str,
    config: Config,
    plan: Plan,
    state: TrainingState,
    run: dict[str, Any],
) -> str:
    """Once every device has written its part into ``staging(directory, state.step)``: write
    training.json there, flush it to disk, and make the folder the step's checkpoint in one rename;
    then remove all but the newest ``KEEP`` committed steps. Called by one process. -> the folder."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    final = step_folder(directory, state.step)
    partial = final + ".partial"
    training = {
        "format": FORMAT,
        "framework": framework,
        "config": config.to_json(),
        "plan": dataclasses.asdict(plan),
        "step": int(state.step),
        "losses": [float(x) for x in state.losses],
        "dropout": state.dropout,
        "run": run,
    }
    with open(os.path.join(partial, TRAINING_FILE), "w", encoding="utf-8") as f:
        json.dump(training, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _fsync_tree(partial)
    if os.path.exists(final):  # the same step saved again (a run resumed from an older one)
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old)
    else:
        os.rename(partial, final)
    _fsync_dir(os.fspath(directory))
    for older in committed_steps(directory)[:-KEEP]:
        shutil.rmtree(step_folder(directory, older), ignore_errors=True)
    return final


def committed_steps(directory: str | os.PathLike) -> list[int]:
    """The steps with a committed checkpoint in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    steps = []
    for entry in os.listdir(directory):
        match = _STEP.fullmatch(entry)
        if match and os.path.isfile(os.path.join(directory, entry, TRAINING_FILE)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest(directory: str | os.PathLike) -> str | None:
    """The newest committed step's folder in a run's ``directory`` (None: there is none)."""
    steps = committed_steps(directory)
    return step_folder(directory, steps[-1]) if steps else None


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """A run's folder with a committed step, or one step's folder."""
    path = os.fspath(path)
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, TRAINING_FILE)) or latest(path) is not None
    )


def read(path: str | os.PathLike) -> ShardedCheckpoint:
    """A committed checkpoint: one step's folder, or a run's folder (its ``latest``).
    ``WeightsFileError`` (one line) for anything else."""
    path = os.fspath(path)
    folder = path if os.path.isfile(os.path.join(path, TRAINING_FILE)) else latest(path)
    if folder is None:
        partial = [e for e in os.listdir(path) if e.endswith(".partial")] if os.path.isdir(path) else []
        what = f" (only {sorted(partial)}, whose saves never finished)" if partial else ""
        raise WeightsFileError(f"{path!r} holds no committed sharded checkpoint{what}")
    try:
        with open(os.path.join(folder, TRAINING_FILE), encoding="utf-8") as f:
            training = json.load(f)
        if training.get("format") != FORMAT:
            raise ValueError(f"format {training.get('format')!r}, expected {FORMAT!r}")
        if training["framework"] not in FRAMEWORKS:
            raise ValueError(f"framework {training['framework']!r}, expected one of {FRAMEWORKS}")
        config = Config.from_json(training["config"])
        plan = Plan(**training["plan"])
        check_plan(config, plan)
        state = TrainingState(int(training["step"]), [float(x) for x in training["losses"]], {}, training["dropout"])
        if len(state.losses) != state.step:
            raise ValueError(f"{len(state.losses)} losses for step {state.step}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise WeightsFileError(f"{folder!r} is not a sharded checkpoint: {error}") from None
    return ShardedCheckpoint(folder, training["framework"], config, plan, state, training["run"])


def _fsync_tree(folder: str) -> None:
    """Every file the devices wrote into ``folder``, on disk before the rename commits them."""
    for root, _, files in os.walk(folder):
        for name in files:
            descriptor = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        _fsync_dir(root)


def _fsync_dir(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def whole_tensors(checkpoint: ShardedCheckpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """-> (weights, Adam's moments ``m.<name>``/``v.<name>``), whole NumPy arrays under the canonical
    names and layout, read by the framework that wrote them (installed: its files are its own)."""
    module = importlib.import_module(f"{checkpoint.framework}_impl.sharded_checkpoint")
    return module.whole_tensors(checkpoint)


def consolidate(path: str | os.PathLike, file: str | os.PathLike) -> ShardedCheckpoint:
    """The committed checkpoint at ``path`` (a run's folder: its latest step; or one step's folder),
    whatever framework and plan wrote it, as one training checkpoint file
    (``transformer_run.checkpoint``): every backend loads it as the trained model and resumes from
    it, on one device or under any plan. Reads one framework's shards into whole tensors: this is
    the one place a whole model is held, offline, after the run. -> the checkpoint read."""
    from .checkpoint import save_checkpoint

    checkpoint = read(path)
    params, moments = whole_tensors(checkpoint)
    state = dataclasses.replace(checkpoint.state, moments=moments)
    run = checkpoint.run | {"framework": checkpoint.framework, "plan": dataclasses.asdict(checkpoint.plan)}
    save_checkpoint(file, checkpoint.config, params, state, run)
    return checkpoint
