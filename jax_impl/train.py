"""Training: one step is loss, gradients (``nnx.value_and_grad``) and an Adam update, the
three compiled together into one XLA program by ``nnx.jit``.

A run can stop and resume exactly: ``training_state`` reads where it stands (Adam's step and
moments under the weights' canonical names and layout, the dropout streams, the losses), and
``restore_training_state`` puts that back into a new model and optimizer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer_run.batches import split_batch
from transformer_run.mixed_precision import check_compute_dtype
from transformer_run.train import TrainingState, train_loop
from transformer_spec import param_schema, parent_of
from transformer_spec.checks import inputs_checked

from .checks import check_token_ids
from .layers import Dropout, seed_dropout
from .loss import cross_entropy
from .mixed_precision import in_compute_dtype, keep_random_streams
from .optim import Adam
from .params import _to_flax_name


@nnx.jit(static_argnames=("label_smoothing", "compute_dtype"))
def _update(  # differs: jax-jit
    model,
    optimizer: nnx.Optimizer,
    inputs: tuple,
    targets: jax.Array,
    label_smoothing: float,
    compute_dtype: str | None = None,
) -> jax.Array:
    def loss_fn(model):
        # differs: mixed-precision
        forward = model if compute_dtype is None else in_compute_dtype(model, compute_dtype)
        with inputs_checked():  # train_step checked them eagerly, before this jit
            logits = forward(*inputs).logits  # (B, T, V), traced inside this jit
        if forward is not model:  # differs: mixed-precision
            logits = logits.astype(jnp.float32)  # the loss in float32
            keep_random_streams(model, forward)
        return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()

    loss, grads = nnx.value_and_grad(loss_fn)(model)  # grads: an nnx.State shaped like the Params
    # the model's Params change in place (NNX writes the new values back)
    optimizer.update(model, grads)
    return loss


def train_step(
    model,
    optimizer: Adam,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> float:
    """One update on ``batch`` (see transformer_run.batches); returns the loss before it.
    ``compute_dtype="bfloat16"``: the passes in bf16, the weights and Adam in float32
    (mixed_precision.py)."""
    inputs, targets = split_batch(model.config, batch)
    inputs, targets = tuple(jnp.asarray(x) for x in inputs), jnp.asarray(targets)
    # Inside jit the ids' values are unknown, so they are checked here, eagerly, as compiled() does.
    model.check_inputs(*inputs)
    check_token_ids("targets", targets, model.config.tgt_vocab_size, None)
    optimizer.set_learning_rate()
    if model is optimizer.model:  # the usual case: the cached step (see _cached_update)
        return float(_cached_update(optimizer)(inputs, targets, label_smoothing, compute_dtype))
    loss = _update(model, optimizer.optimizer, inputs, targets, label_smoothing, compute_dtype)
    return float(loss)


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
    m, v = _adam_moment_variables(optimizer, name)  # optax's nnx variables, like the weight
    return np.array(m[...]), np.array(v[...])


def _set_adam_moments(optimizer: Adam, name: str, m: np.ndarray, v: np.ndarray) -> None:
    # differs: framework-optimizer
    m_variable, v_variable = _adam_moment_variables(optimizer, name)
    m_variable[...] = jnp.asarray(m, dtype=m_variable[...].dtype)  # like the weight
    v_variable[...] = jnp.asarray(v, dtype=v_variable[...].dtype)  # like the weight


def _adam_moment_variables(optimizer: Adam, name: str) -> tuple:  # differs: framework-optimizer
    """optax's m and v of the weight ``name`` (nnx variables), found by its path in the model's
    graph."""
    parent, leaf = parent_of(optimizer.model, name)
    path = (
        [int(part) if part.isdigit() else part for part in name.split(".")[:-1]]
        + [_to_flax_name(parent, leaf)]
    )
    adam = optimizer.optimizer.opt_state.inner_state[0]  # optax.ScaleByAdamState(count, mu, nu)
    return tuple(
        functools.reduce(lambda state, key: state[key], path, moments)
        for moments in (adam.mu, adam.nu)
    )


def _set_adam_step(optimizer: Adam, step: int) -> None:
    """Adam's step count: its bias corrections, and the schedule's position."""
    optimizer.t = step
    # differs: framework-optimizer
    state = optimizer.optimizer.opt_state
    # nnx's, optax's, adam's
    for count in (optimizer.optimizer.step, state.count, state.inner_state[0].count):
        count[...] = jnp.asarray(step, dtype=count[...].dtype)


def dropout_streams(model) -> list[Any]:
    """Each Dropout's random stream where it stands, as JSON (its RngStream's key and count)."""
    # differs: dropout-streams
    dropouts = [module for _, module in nnx.iter_graph(model) if isinstance(module, Dropout)]
    return [
        {
            "key": np.asarray(jax.random.key_data(d.rngs.key[...])).tolist(),
            "count": int(d.rngs.count[...]),
        }
        for d in dropouts
    ]


def set_dropout_streams(model, streams: list[Any]) -> None:
    """Put back what ``dropout_streams`` read: the next masks are those the run would have drawn."""
    # differs: dropout-streams
    dropouts = [module for _, module in nnx.iter_graph(model) if isinstance(module, Dropout)]
    for module, stream in zip(dropouts, streams, strict=True):
        module.rngs.key[...] = jax.random.wrap_key_data(
            jnp.asarray(stream["key"], dtype=jnp.uint32)
        )
        module.rngs.count[...] = jnp.asarray(stream["count"], dtype=jnp.uint32)
