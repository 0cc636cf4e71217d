"""The loss of a batch and its gradient with respect to every parameter, by the hand-written backward.

NumPy has no autograd: ``model.forward_for_backward`` runs the forward pass keeping what
each module's ``backward`` needs, and ``model.backward`` runs it in reverse, module by
module, from the loss's gradient down to the embeddings (llm.c style). torch_impl gets
the same numbers from ``torch.autograd``, jax_impl from ``jax.grad``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec import param_schema
from transformer_spec.batches import split_batch

from .loss import cross_entropy_backward, cross_entropy_for_backward


def loss_and_grads(
    model: Any, batch: Mapping[str, np.ndarray], label_smoothing: float = 0.0
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the cross-entropy of ``batch``, {canonical parameter name: gradient}).

    ``batch``: see ``transformer_spec.batches`` ({"src_ids", "tgt_in", "tgt_out"} for the
    encoder-decoder, {"ids", "targets"} for the decoder-only LM). The gradients have the
    canonical names and [in, out] layout of ``param_schema``, in its order.
    """
    inputs, targets = split_batch(model.config, batch)
    output, saved = model.forward_for_backward(*(np.asarray(x) for x in inputs))
    loss, loss_saved = cross_entropy_for_backward(
        output.logits, np.asarray(targets), model.config.pad_id, label_smoothing
    )  # (), ...
    grad_logits = cross_entropy_backward(loss_saved)  # (B, T, V): d loss / d logits
    _, grads = model.backward(saved, grad_logits)
    return float(loss), {name: grads[name] for name in param_schema(model.config)}
