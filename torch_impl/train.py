"""Training: one step is loss, gradients (``loss.backward()``, autograd), and an Adam update.

A run can stop and resume exactly: ``training_state`` reads where it stands (Adam's step and
moments under the weights' canonical names and layout, the dropout streams, the losses), and
``restore_training_state`` puts that back into a new model and optimizer."""

from __future__ import annotations

import base64
import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from transformer_run.batches import split_batch
from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.train import TrainingState, train_loop
from transformer_spec import param_schema, parent_of

from .compiled import compiled_train_step
from .layers import seed_dropout
from .loss import cross_entropy
from .mixed_precision import compute_in_bf16
from .optim import Adam
from .params import _to_torch_layout


def train_step(
    model,
    optimizer: Adam,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> float:
    """One update on ``batch`` (see transformer_run.batches); returns the loss before it.
    ``compute_dtype="bfloat16"``: the forward under torch.autocast, the weights and Adam in
    float32."""
    inputs, targets = split_batch(model.config, batch)
    # differs: framework-autograd
    with torch.enable_grad():  # callers may hold a no_grad context (evaluation, tests)
        # differs: mixed-precision
        with compute_in_bf16(model) if compute_dtype is not None else contextlib.nullcontext():
            logits = model(*(torch.as_tensor(x) for x in inputs)).logits  # (B, T, V)
        if compute_dtype is not None:  # differs: mixed-precision
            logits = logits.float()  # the loss in float32
        loss = cross_entropy(
            logits, torch.as_tensor(targets), model.config.pad_id, label_smoothing
        )  # ()
        loss.backward()  # fills every parameter's .grad
    optimizer.step()
    return float(loss.detach())


def train(
    model,
    batches: Sequence[Mapping[str, Any]],
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
    if compiled_step and compute_dtype is None:  # differs: torch-compile
        step = compiled_train_step
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
    parent, leaf = parent_of(optimizer.model, name)
    state = optimizer.optimizer.state[getattr(parent, leaf)]  # torch.optim.Adam's, per parameter
    # torch's layout
    m, v = state["exp_avg"].detach().cpu().numpy(), state["exp_avg_sq"].detach().cpu().numpy()
    return np.array(_to_torch_layout(parent, leaf, m)), np.array(_to_torch_layout(parent, leaf, v))


def _set_adam_moments(optimizer: Adam, name: str, m: np.ndarray, v: np.ndarray) -> None:
    # differs: framework-optimizer
    parent, leaf = parent_of(optimizer.model, name)
    parameter = getattr(parent, leaf)
    # torch's layout
    m, v = (np.ascontiguousarray(_to_torch_layout(parent, leaf, x)) for x in (m, v))
    optimizer.optimizer.state[parameter] = {
        "exp_avg": torch.tensor(m, dtype=parameter.dtype, device=parameter.device),
        "exp_avg_sq": torch.tensor(v, dtype=parameter.dtype, device=parameter.device),
    }


def _set_adam_step(optimizer: Adam, step: int) -> None:
    """Adam's step count: its bias corrections, and the schedule's position."""
    optimizer.t = step
    # differs: framework-optimizer
    for state in optimizer.optimizer.state.values():
        # torch.optim.Adam counts in a float tensor per parameter
        state["step"] = torch.tensor(float(step))
    optimizer.lr_scheduler.last_epoch = step  # LambdaLR: the next rate is schedule(step + 1)
    for group in optimizer.optimizer.param_groups:
        group["lr"] = optimizer.schedule(step + 1)


def dropout_streams(model) -> str:
    """Each Dropout's random stream where it stands, as JSON (torch's global generator's state)."""
    # differs: dropout-streams
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def set_dropout_streams(model, streams: str) -> None:
    """Put back what ``dropout_streams`` read: the next masks are those the run would have drawn."""
    # differs: dropout-streams
    state = np.frombuffer(base64.b64decode(streams), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(state))
