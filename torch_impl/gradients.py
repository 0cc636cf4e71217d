"""The loss of a batch and its gradient with respect to every parameter, by ``torch.autograd``.

numpy_impl computes the same numbers with a hand-written backward pass; jax_impl with
``jax.grad``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from transformer_run.batches import split_batch
from transformer_run.mixed_precision import check_compute_dtype
from transformer_spec import param_schema, parent_of

from .loss import cross_entropy
from .mixed_precision import compute_in_bf16
from .params import _to_torch_layout


def loss_and_grads(
    model: nn.Module,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """-> (the cross-entropy of ``batch``, {canonical parameter name: gradient as a NumPy array}).

    ``batch``: see ``transformer_run.batches`` ({"src_ids", "tgt_in", "tgt_out"} for the
    encoder-decoder, {"ids", "targets"} for the decoder-only LM), NumPy arrays or tensors.
    The gradients have the canonical names and [in, out] layout of ``param_schema``.
    ``compute_dtype="bfloat16"``: the forward under torch.autocast, float32 gradients
    (mixed_precision.py).
    """
    check_compute_dtype(compute_dtype)
    inputs, targets = split_batch(model.config, batch)
    # differs: framework-autograd
    names = list(param_schema(model.config))
    leaves = [parent_of(model, name) for name in names]  # (module, attribute) per canonical name
    parameters = [getattr(parent, leaf) for parent, leaf in leaves]
    with torch.enable_grad():  # (the test adapter runs models under no_grad)
        # differs: mixed-precision
        with compute_in_bf16(model) if compute_dtype is not None else contextlib.nullcontext():
            logits = model(*(torch.as_tensor(x) for x in inputs)).logits  # (B, T, V)
        if compute_dtype is not None:  # differs: mixed-precision
            logits = logits.float()  # the loss in float32
        loss = cross_entropy(
            logits, torch.as_tensor(targets), model.config.pad_id, label_smoothing
        )  # ()
        # autograd.grad, not loss.backward(): it returns the gradients and leaves every .grad alone.
        # A tied table is one Parameter used twice; autograd adds both uses' gradients.
        grads = torch.autograd.grad(loss, parameters)
    # _to_torch_layout transposes nn.Linear's [out, in] back to the canonical [in, out]
    return float(loss.detach()), {
        name: np.array(_to_torch_layout(parent, leaf, grad.detach().cpu().numpy()))
        for name, (parent, leaf), grad in zip(names, leaves, grads, strict=True)
    }
