"""Training checkpoints: a weights file (``transformer_spec.io``) that also holds where the run
stands, so that a run killed at any moment resumes exactly where its last checkpoint was taken.

One safetensors file, written atomically like every weights file (a process killed in the
middle of a save leaves the previous checkpoint whole):

- the weights under their canonical names (``load_params`` and every backend's ``load_model``
  read a checkpoint as the trained model: the rest is skipped);
- ``optimizer.m.<name>`` and ``optimizer.v.<name>``: Adam's moments, in the weights' layout;
- metadata ``training``: JSON with Adam's step, the loss of every step so far (exact: JSON
  writes a float as its shortest repr, which reads back to the same float), the dropout
  streams, and ``run``: what the caller needs to rebuild the same run (the command line's
  task, seed, backend, schedule...).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from transformer_spec.checks import WeightsError, WeightsFileError, check_params
from transformer_spec.config import Config
from transformer_spec.io import FORMAT, TRAINING, check_finite, check_weights, read_safetensors, write_safetensors
from transformer_spec.schema import param_schema

from .train import TrainingState

_MOMENTS = "optimizer."


@dataclasses.dataclass
class Checkpoint:
    config: Config
    params: dict[str, np.ndarray]  # the weights after ``state.step`` steps
    state: TrainingState
    run: dict[str, Any]  # the caller's description of the run (JSON)


def save_checkpoint(
    path: str | os.PathLike, config: Config, params: dict[str, Any], state: TrainingState, run: dict[str, Any]
) -> None:
    """Write the weights, ``state`` and ``run`` to ``path``, atomically; refuses (``WeightsError``)
    weights or moments that do not fit ``config``, are not all of one float dtype, or are not finite."""
    arrays = check_weights(params, config)
    moments = {f"{_MOMENTS}{k}": np.asarray(v) for k, v in state.moments.items()}
    _check_moments(moments, config, next(iter(arrays.values())).dtype)
    training = {
        "step": int(state.step),
        "losses": [float(x) for x in state.losses],
        "dropout": state.dropout,
        "run": run,
    }
    _check_training(training, "the state to save")
    metadata = {"format": FORMAT, "config": config.to_json(), TRAINING: json.dumps(training, sort_keys=True)}
    write_safetensors(path, arrays | moments, metadata)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a file written by :func:`save_checkpoint`. ``WeightsFileError`` for a file that is not
    one (a weights file without training state names ``save_params``), ``WeightsError`` for
    weights or moments that do not fit the stored config."""
    path = os.fspath(path)
    tensors, metadata, config = read_safetensors(path)
    if TRAINING not in metadata:
        raise WeightsFileError(
            f"{path!r} holds weights only (written by save_params), not a training checkpoint: it has no "
            "optimizer state to resume from"
        )
    try:
        training = json.loads(metadata[TRAINING])
    except ValueError as error:
        raise WeightsFileError(f"{path!r} holds training state that is not valid JSON: {error}") from None
    _check_training(training, repr(path))
    params = {k: v for k, v in tensors.items() if not k.startswith(_MOMENTS)}
    params = check_weights(params, config, what=f"the config stored in {path!r}")
    moments = {k: v for k, v in tensors.items() if k.startswith(_MOMENTS)}
    _check_moments(moments, config, next(iter(params.values())).dtype)
    state = TrainingState(
        training["step"],
        list(training["losses"]),
        {k.removeprefix(_MOMENTS): v for k, v in moments.items()},
        training["dropout"],
    )
    return Checkpoint(config, params, state, training["run"])


def _check_moments(moments: dict[str, np.ndarray], config: Config, dtype: np.dtype) -> None:
    """``optimizer.m.<name>`` and ``optimizer.v.<name>`` for every weight, shaped like it, in its dtype, finite."""
    schema = {
        f"{_MOMENTS}{which}.{name}": shape for which in ("m", "v") for name, shape in param_schema(config).items()
    }
    check_params({k: v.shape for k, v in moments.items()}, schema, what="Adam's moments for the config")
    other = sorted({str(v.dtype) for v in moments.values()} - {str(dtype)})
    if other:
        raise WeightsError(f"Adam's moments must be {dtype} like the weights, got {other}")
    check_finite(moments)


def _check_training(training: Any, where: str) -> None:
    """The training metadata: a step count, that many float losses, dropout streams, a run."""
    ok = (
        isinstance(training, dict)
        and set(training) == {"step", "losses", "dropout", "run"}
        and isinstance(training["step"], int)
        and not isinstance(training["step"], bool)
        and training["step"] >= 0
        and isinstance(training["losses"], list)
        and len(training["losses"]) == training["step"]
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in training["losses"])
        and isinstance(training["run"], dict)
    )
    if not ok:
        keys = sorted(training) if isinstance(training, dict) else type(training).__name__
        raise WeightsFileError(
            f"{where} holds training state that is not a step count with its losses, dropout streams and run "
            f"(got {keys})"
        )
    if not all(math.isfinite(x) for x in training["losses"]):
        bad = [i + 1 for i, x in enumerate(training["losses"]) if not math.isfinite(x)][:5]
        raise WeightsError(f"{where}: the loss is not finite at steps {bad}: the run diverged, nothing to resume")
