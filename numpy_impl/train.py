"""Training: one step is loss, gradients (the hand-written backward), and an Adam update.

A run can stop and resume exactly: ``training_state`` reads where it stands (Adam's step and
moments under the weights' canonical names and layout, the dropout streams, the losses), and
``restore_training_state`` puts that back into a new model and optimizer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.train import TrainingState, train_loop
from transformer_spec import param_schema

from .gradients import loss_and_grads
from .layers import Dropout, seed_dropout
from .module import named_submodules
from .optim import Adam


def train_step(
    model,
    optimizer: Adam,
    batch: Mapping[str, np.ndarray],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> float:
    """One update on ``batch`` (see transformer_run.batches); returns the loss before it.
    ``compute_dtype="bfloat16"``: the passes in bf16, the weights and Adam in float32
    (mixed_precision.py)."""
    loss, grads = loss_and_grads(model, batch, label_smoothing, compute_dtype)
    optimizer.step(grads)
    return loss


def train(
    model,
    batches: Sequence[Mapping[str, np.ndarray]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
    resume: TrainingState | None = None,
    checkpoint: Callable[[TrainingState], None] | None = None,
    checkpoint_every: int = 0,
    compute_dtype: str | None = None,
    compiled_step: bool = False,
) -> list[float]:
    """``steps`` Adam updates at ``schedule``'s rates, cycling through ``batches`` in order;
    returns the loss of every step. The loop itself (training mode with dropout drawn from
    ``seed``, ``callback(step, loss)``, back to inference mode; ``resume`` from a
    ``TrainingState``, ``checkpoint(state)`` every ``checkpoint_every`` steps and at the end)
    is ``transformer_run.train``'s. ``compute_dtype="bfloat16"``: mixed precision
    (mixed_precision.py). ``compiled_step``: each step as this backend compiles it (compiled.py:
    torch.compile in torch, not with mixed precision; JAX's step is always jit-compiled; NumPy
    has no compiler)."""
    check_compute_dtype(compute_dtype)
    optimizer = Adam(model, schedule)
    step = train_step
    if compute_dtype is not None:
        step = functools.partial(train_step, compute_dtype=compute_dtype)
    return train_loop(
        model, optimizer, step, seed_dropout, batches, steps, label_smoothing, callback, seed,
        resume, checkpoint, checkpoint_every, training_state, restore_training_state,
    )  # fmt: skip


def training_state(model, optimizer: Adam, losses: list[float]) -> TrainingState:
    """Where the run stands: Adam's step and moments (NumPy arrays, canonical names and layout),
    the dropout streams and the losses so far. With the weights, all a resumed run needs."""
    moments = {}
    for name in param_schema(model.config, model.schema):
        m, v = _adam_moments(optimizer, name)  # like the weight: [in, out] for a Linear
        moments[f"m.{name}"], moments[f"v.{name}"] = m, v
    return TrainingState(optimizer.t, list(losses), moments, dropout_streams(model))


def restore_training_state(model, optimizer: Adam, state: TrainingState) -> None:
    """Put ``state`` back into a new ``optimizer`` on ``model`` (which holds the run's weights):
    the next step is ``state.step + 1`` at that step's rate, with the masks it would have drawn."""
    for name in param_schema(model.config, model.schema):
        _set_adam_moments(optimizer, name, state.moments[f"m.{name}"], state.moments[f"v.{name}"])
    _set_adam_step(optimizer, state.step)
    if model.config.dropout > 0:  # else none is read (and a state from another backend has its own)
        set_dropout_streams(model, state.dropout)


def _adam_moments(optimizer: Adam, name: str) -> tuple[np.ndarray, np.ndarray]:
    # differs: framework-optimizer
    m, v = optimizer.m[name], optimizer.v[name]  # like the weight
    return np.array(m), np.array(v)


def _set_adam_moments(optimizer: Adam, name: str, m: np.ndarray, v: np.ndarray) -> None:
    # differs: framework-optimizer
    dtype = optimizer.m[name].dtype
    optimizer.m[name] = np.array(m, dtype=dtype)  # like the weight
    optimizer.v[name] = np.array(v, dtype=dtype)  # like the weight


def _set_adam_step(optimizer: Adam, step: int) -> None:
    """Adam's step count: its bias corrections, and the schedule's position."""
    optimizer.t = step


def dropout_streams(model) -> list[Any]:
    """Each Dropout's random stream where it stands, as JSON (its generator's state)."""
    # differs: dropout-streams
    dropouts = [module for _, module in named_submodules(model) if isinstance(module, Dropout)]
    return [module.rng.bit_generator.state for module in dropouts]


def set_dropout_streams(model, streams: list[Any]) -> None:
    """Put back what ``dropout_streams`` read: the next masks are those the run would have drawn."""
    # differs: dropout-streams
    dropouts = [module for _, module in named_submodules(model) if isinstance(module, Dropout)]
    for module, stream in zip(dropouts, streams, strict=True):
        module.rng.bit_generator.state = stream
