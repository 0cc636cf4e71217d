"""bf16 mixed precision in JAX: Flax's compute dtype (``dtype=bfloat16``, ``param_dtype=float32``).

Flax has no autocast. Each of its modules takes ``dtype``, the dtype it computes in, apart from
``param_dtype``, the dtype its parameters are stored in: an ``nnx.Linear(dtype=bfloat16)`` casts
its float32 kernel and its input to bf16 at every call. ``in_compute_dtype`` does that to a whole
model, from outside it: inside the jitted step it makes a copy whose parameters and buffers are
the float32 ones cast to bf16 and whose Linear layers compute in bf16, and runs the forward pass
on the copy. The whole forward then runs in bf16, the residual stream included (torch's autocast
keeps that in float32: transformer_run.mixed_precision). ``jax.grad`` differentiates through the
casts, so the gradients arrive in float32, for the float32 master weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer_run.batches import split_batch
from transformer_run.mixed_precision import check_compute_dtype, check_master_dtype, check_policy
from transformer_spec.checks import inputs_checked

from .checks import check_token_ids
from .loss import cross_entropy
from .params import to_params


def in_compute_dtype(model: nnx.Module, compute_dtype: str = "bfloat16") -> nnx.Module:
    """A copy of ``model`` computing in ``compute_dtype``: its float parameters and buffers cast
    (the cast is differentiable: gradients flow back to ``model``'s float32 Params), its
    nnx.Linear layers' ``dtype`` set. Dropout's random streams are the model's own
    (``keep_random_streams`` writes them back)."""
    graphdef, state = nnx.split(model)
    cast = jax.tree.map(
        lambda x: x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state
    )
    copy = nnx.merge(graphdef, cast)
    for _, module in nnx.iter_graph(copy):
        if isinstance(module, nnx.Linear):
            # Flax's compute dtype: kernel and input cast at each call
            module.dtype = jnp.dtype(compute_dtype)
    return copy


def keep_random_streams(model: nnx.Module, copy: nnx.Module) -> None:
    """The dropout streams ``copy`` advanced, written back into ``model`` (the next step draws
    new masks)."""
    nnx.update(model, nnx.state(copy, nnx.RngState))


def _check(model: nnx.Module, compute_dtype: str, policy: str | None) -> None:
    check_compute_dtype(compute_dtype)
    check_policy("jax", policy)
    weight = next(iter(jax.tree.leaves(nnx.state(model, nnx.Param))))
    check_master_dtype(str(weight.dtype))


@nnx.jit(static_argnames=("compute_dtype",))
def _logits(model, inputs: tuple, compute_dtype: str) -> jax.Array:
    with inputs_checked():  # mixed_precision_logits checked them eagerly, before this jit
        copy = in_compute_dtype(model, compute_dtype)
        return copy(*inputs).logits.astype(jnp.float32)  # (B, T, V)


def mixed_precision_logits(
    model, *inputs, compute_dtype: str = "bfloat16", policy: str | None = None
) -> np.ndarray:
    """The model's logits (float32, as a NumPy array) on ``inputs``, computed in
    ``compute_dtype``."""
    _check(model, compute_dtype, policy)
    checked = model.check_inputs(*inputs)  # eagerly: inside jit the ids' values are unknown
    return np.asarray(_logits(model, checked, compute_dtype))


@nnx.jit(static_argnames=("label_smoothing", "compute_dtype"))
def _loss_and_grads(
    model, inputs: tuple, targets: jax.Array, label_smoothing: float, compute_dtype: str
):
    def loss_fn(model):
        copy = in_compute_dtype(model, compute_dtype)
        with inputs_checked():
            logits = copy(*inputs).logits.astype(jnp.float32)  # (B, T, V): the loss in float32
        keep_random_streams(model, copy)
        return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()

    return nnx.value_and_grad(loss_fn)(model)  # grads: float32, an nnx.State shaped like the Params


def mixed_precision_loss_and_grads(
    model,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str = "bfloat16",
    policy: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """``training.loss_and_grads`` with the passes in ``compute_dtype``: the loss (float32, from the
    float32 logits) and the float32 gradients of the float32 master weights."""
    _check(model, compute_dtype, policy)
    inputs, targets = split_batch(model.config, batch)
    checked = model.check_inputs(*(jnp.asarray(x) for x in inputs))
    targets = jnp.asarray(targets)
    check_token_ids("targets", targets, model.config.tgt_vocab_size, None)
    loss, grads = _loss_and_grads(model, checked, targets, label_smoothing, compute_dtype)
    graphdef, _, others = nnx.split(model, nnx.Param, ...)
    return float(loss), to_params(nnx.merge(graphdef, grads, others))
