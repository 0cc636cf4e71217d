"""Training: one step is loss, gradients (``nnx.value_and_grad``) and an Adam update, the
three compiled together into one XLA program by ``nnx.jit``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from transformer_spec.batches import split_batch
from transformer_spec.checks import inputs_checked
from transformer_spec.train import train_loop

from .layers import seed_dropout
from .loss import cross_entropy
from .optim import Adam
from .validate import check_token_ids


@nnx.jit(static_argnames=("label_smoothing",))
def _update(  # differs: jax-jit
    model, optimizer: nnx.Optimizer, inputs: tuple, targets: jax.Array, label_smoothing: float
) -> jax.Array:
    def loss_fn(model):
        with inputs_checked():  # train_step checked them eagerly, before this jit
            logits = model(*inputs).logits  # (B, T, V), traced inside this jit
        return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()

    loss, grads = nnx.value_and_grad(loss_fn)(model)  # grads: an nnx.State shaped like the Params
    optimizer.update(model, grads)  # the model's Params change in place (NNX writes the new values back)
    return loss


def train_step(model, optimizer: Adam, batch: Mapping[str, Any], label_smoothing: float = 0.0) -> float:
    """One update on ``batch`` (see transformer_spec.batches); returns the loss before it."""
    inputs, targets = split_batch(model.config, batch)
    inputs, targets = tuple(jnp.asarray(x) for x in inputs), jnp.asarray(targets)
    # Inside jit the ids' values are unknown, so they are checked here, eagerly, as compiled() does.
    model.check_inputs(*inputs)
    check_token_ids("targets", targets, model.config.tgt_vocab_size, None)
    optimizer.set_learning_rate()
    if model is optimizer.model:  # the usual case: the cached step (see _cached_update)
        return float(_cached_update(optimizer)(inputs, targets, label_smoothing))
    return float(_update(model, optimizer.optimizer, inputs, targets, label_smoothing))


def _cached_update(optimizer: Adam):  # differs: jax-jit
    """``_update`` with the model and optimizer bound by ``nnx.cached_partial``.

    ``nnx.jit`` walks the whole module graph (every layer, every Param, the optimizer's
    moments) on each call to split it into arrays and merge the results back: ~20 ms of
    Python per step on the tiny model, four times the compiled step itself. The cached
    partial walks it once and reuses the traversal (measured: 26 -> 6 ms per tiny step);
    the arrays are still read and written back on every call, so set_learning_rate's
    new rate is seen."""
    if getattr(optimizer, "_cached_update", None) is None:
        optimizer._cached_update = nnx.cached_partial(_update, optimizer.model, optimizer.optimizer)
    return optimizer._cached_update


def train(
    model,
    batches: Sequence[Mapping[str, Any]],
    steps: int,
    schedule: Callable[[int], float],
    label_smoothing: float = 0.0,
    callback: Callable[[int, float], None] | None = None,
    seed: int = 0,
) -> list[float]:
    """``steps`` Adam updates at ``schedule``'s rates, cycling through ``batches`` in order;
    returns the loss of every step. The loop itself (training mode with dropout drawn from
    ``seed``, ``callback(step, loss)``, back to inference mode) is ``transformer_spec.train``'s."""
    optimizer = Adam(model, schedule)
    return train_loop(model, optimizer, train_step, seed_dropout, batches, steps, label_smoothing, callback, seed)
