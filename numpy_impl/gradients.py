"""The loss of a batch and its gradient with respect to every parameter, by a hand-written backward.

NumPy has no autograd: inside ``enable_grad()`` the forward pass keeps, in each module,
what that module's ``backward`` needs, and ``model.backward`` runs it in reverse, module
by module, from the loss's gradient down to the embeddings (llm.c style). torch_impl gets
the same numbers from ``torch.autograd``, jax_impl from ``jax.grad``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy import ndarray as Array

from transformer_run.batches import split_batch
from transformer_spec import param_schema

from .loss import cross_entropy, cross_entropy_backward
from .mixed_precision import mixed_precision_loss_and_grads
from .module import enable_grad


def loss_and_grads(
    model: Any,
    batch: Mapping[str, Array],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, Array]]:
    """-> (the cross-entropy of ``batch``, {canonical parameter name: gradient}).

    ``batch``: see ``transformer_run.batches`` ({"src_ids", "tgt_in", "tgt_out"} for the
    encoder-decoder, {"ids", "targets"} for the decoder-only LM). The gradients have the
    canonical names and [in, out] layout of ``param_schema``, in its order.
    ``compute_dtype="bfloat16"``: the passes in bf16, float32 gradients (mixed_precision.py).
    """
    if compute_dtype is not None:  # differs: mixed-precision
        return mixed_precision_loss_and_grads(model, batch, label_smoothing, compute_dtype)
    inputs, targets = split_batch(model.config, batch)
    with enable_grad():  # every module keeps what its backward needs
        output = model(*(np.asarray(x) for x in inputs))
    targets = np.asarray(targets)  # (B, T)
    loss = cross_entropy(output.logits, targets, model.config.pad_id, label_smoothing)  # ()
    grad_logits = cross_entropy_backward(
        output.logits, targets, model.config.pad_id, label_smoothing
    )  # (B, T, V)
    _, grads = model.backward(grad_logits)
    return float(loss), {name: grads[name] for name in param_schema(model.config)}
