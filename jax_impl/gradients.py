"""The loss of a batch and its gradient with respect to every parameter, by ``jax.grad``.

numpy_impl computes the same numbers with a hand-written backward pass; torch_impl with
``torch.autograd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from transformer_run.batches import split_batch

from .compiled import compiled
from .loss import cross_entropy
from .mixed_precision import mixed_precision_loss_and_grads
from .params import to_params


def loss_and_grads(
    model: nnx.Module,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the cross-entropy of ``batch``, {canonical parameter name: gradient as a NumPy array}).

    ``batch``: see ``transformer_run.batches`` ({"src_ids", "tgt_in", "tgt_out"} for the
    encoder-decoder, {"ids", "targets"} for the decoder-only LM), NumPy or JAX arrays.
    The gradients have the canonical names and [in, out] layout of ``param_schema``.
    ``compute_dtype="bfloat16"``: the passes in bf16, float32 gradients (mixed_precision.py).
    """
    if compute_dtype is not None:  # differs: mixed-precision
        return mixed_precision_loss_and_grads(model, batch, label_smoothing, compute_dtype)
    inputs, targets = split_batch(model.config, batch)
    inputs, targets = tuple(jnp.asarray(x) for x in inputs), jnp.asarray(targets)

    def loss_fn(model: nnx.Module) -> Array:
        # compiled(model) checks the (concrete) ids eagerly, then runs the jit-compiled forward pass
        logits = compiled(model)(*inputs).logits  # (B, T, V)
        return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()

    # Differentiates with respect to the model's nnx.Params (not its Buffers, e.g. the
    # sinusoidal table). A tied table is one Param used twice; jax.grad adds both uses.
    loss, grads = nnx.value_and_grad(loss_fn)(model)  # grads: an nnx.State shaped like the Params
    # The gradient State has the model's structure: merged into a copy of the model in
    # place of its Params, it reads out through to_params like weights (canonical names,
    # kernel -> weight).
    graphdef, _, others = nnx.split(model, nnx.Param, ...)
    return float(loss), to_params(nnx.merge(graphdef, grads, others))
