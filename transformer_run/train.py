"""The training loop, written once for every backend (as ``decoding`` is the search).

A backend's ``train`` hands in what is its own: its optimizer (already built on the model),
its ``train_step(model, optimizer, batch, label_smoothing) -> loss`` (forward, loss,
gradients, update) and its ``seed_dropout``; to checkpoint and resume, also its
``training_state(model, optimizer, losses) -> TrainingState`` and
``restore_training_state(model, optimizer, state)``. Everything else (the order of the
batches, training mode around the loop, the callback, when a checkpoint is taken, where a
resumed run starts) is here, so the three cannot differ in it.

A run stopped after step s and resumed from its ``TrainingState`` continues exactly as if it
had never stopped: the batches are chosen by the step number alone, and the state holds the
rest (Adam's step and moments, so the schedule's position too; the dropout random streams;
the losses so far). ``transformer_run.checkpoint`` writes it to a file with the weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

TrainStep = Callable[[Any, Any, Mapping[str, Any], float], float]


@dataclasses.dataclass
class TrainingState:
    """Where a run stands after ``step`` updates, besides its weights (the model holds those)."""

    step: int  # updates done; the next one is step + 1
    losses: list[float]  # the loss of steps 1 .. step
    moments: dict[str, np.ndarray]  # "m.<name>", "v.<name>": Adam's moments, the weights' names and layout
    dropout: Any  # the dropout random streams, in each backend's own form (JSON: lists, dicts, ints, strings)


def train_loop(
    model: Any,
    optimizer: Any,
    train_step: TrainStep,
    seed_dropout: Callable[[Any, int], None],
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
    resume: TrainingState | None = None,
    checkpoint: Callable[[TrainingState], None] | None = None,
    checkpoint_every: int = 0,
    training_state: Callable[[Any, Any, list[float]], TrainingState] | None = None,
    restore_training_state: Callable[[Any, Any, TrainingState], None] | None = None,
) -> list[float]:
    """``steps`` calls of ``train_step`` in all, cycling through ``batches`` in order; returns the
    loss of every step, and calls ``callback(step, loss)`` (1-based) after each.

    The model trains in training mode (dropout on, if ``config.dropout > 0``, its masks drawn
    from ``seed``) and is left in inference mode, as ``build_model`` and ``load_model`` give it.

    ``resume``: a state taken after step s (the model already holds that step's weights): the
    loop puts it back and runs steps s + 1 .. ``steps``; the losses returned are all ``steps``.
    ``checkpoint(state)`` is called every ``checkpoint_every`` steps (0: never in between) and
    after the last one."""
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be a non-negative number of steps, got {checkpoint_every}")
    if resume is not None and not (0 <= resume.step <= steps and len(resume.losses) == resume.step):
        raise ValueError(
            f"the run to resume has done {resume.step} steps ({len(resume.losses)} losses): steps must be at "
            f"least that, got {steps}"
        )
    model.train()
    seed_dropout(model, seed)
    start, losses = 0, []
    if resume is not None:
        restore_training_state(model, optimizer, resume)
        start, losses = resume.step, list(resume.losses)
    try:
        for t in range(start + 1, steps + 1):
            losses.append(train_step(model, optimizer, batches[(t - 1) % len(batches)], label_smoothing))
            if callback is not None:
                callback(t, losses[-1])
            if checkpoint is not None and (t == steps or (checkpoint_every and t % checkpoint_every == 0)):
                checkpoint(training_state(model, optimizer, losses))
        return losses
    finally:
        model.eval()
