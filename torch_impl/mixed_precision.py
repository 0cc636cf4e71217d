"""bf16 mixed precision in torch: ``torch.autocast``, the framework's own (CPU and CUDA).

The weights stay float32 (the master weights Adam updates). Inside ``torch.autocast`` each
matmul and ``nn.Linear`` casts its inputs to bf16 and returns bf16; every other op runs in the
dtype its inputs promote to, so the embeddings, the norms (they meet the float32 residual
stream) and the residual stream stay float32 (transformer_run.mixed_precision has the policy
and how JAX's differs). The loss is computed outside autocast, on the logits cast to float32;
autograd carries the gradient back through autocast's casts, so it reaches the float32
weights as float32.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from transformer_run.mixed_precision import check_compute_dtype, check_master_dtype, check_policy


@contextmanager
def compute_in_bf16(model: nn.Module, policy: str | None = None) -> Iterator[None]:
    """Inside: ``model``'s forward runs under ``torch.autocast(<its device>, torch.bfloat16)``
    (``policy``: "autocast", torch's one, or None)."""
    check_policy("torch", policy)
    weight = next(model.parameters())
    check_master_dtype(str(weight.dtype).removeprefix("torch."))
    with torch.autocast(device_type=weight.device.type, dtype=torch.bfloat16):
        yield


def mixed_precision_logits(
    model: nn.Module, *inputs, compute_dtype: str = "bfloat16", policy: str | None = None
) -> np.ndarray:
    """The model's logits (float32, as a NumPy array) on ``inputs``, computed under autocast."""
    check_compute_dtype(compute_dtype)
    with torch.no_grad(), compute_in_bf16(model, check_policy("torch", policy)):
        logits = model(*inputs).logits  # (B, T, V), bf16
    return logits.float().cpu().numpy()


def mixed_precision_loss_and_grads(
    model: nn.Module,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str = "bfloat16",
    policy: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """``training.loss_and_grads`` with the forward under autocast: the loss (float32, from the
    float32 logits) and the float32 gradients of the float32 master weights."""
    check_policy("torch", policy)
    from .gradients import loss_and_grads  # (gradients.py imports this module)

    return loss_and_grads(model, batch, label_smoothing, compute_dtype)
