"""Token cross-entropy with padding and label smoothing; the same definition in every backend.

For one position with logits z (V,), log-probabilities log p = log_softmax(z) and target y:

    loss_t = (1 - eps) * -log p_y  +  eps * mean_v(-log p_v)

i.e. the cross-entropy against the smoothed distribution q = (1 - eps) onehot(y) + eps / V,
where the eps / V covers the whole vocabulary, the target and the padding id included
(``torch.nn.functional.cross_entropy(label_smoothing=eps)`` and ``optax.smooth_labels``
define it so; the paper's reference code spreads eps over V - 2 classes instead).

    loss = sum of loss_t over positions whose target is not pad_id / their number

A batch with no such position has loss 0 (and zero gradients), not 0 / 0 = NaN
(``F.cross_entropy(ignore_index=pad_id)`` returns NaN there). Its gradient comes from
``torch.autograd``; numpy_impl writes it by hand.
"""

from __future__ import annotations

import torch
from torch import Tensor as Array

from transformer_spec.checks import check_loss_inputs

from .checks import check_token_ids


def cross_entropy(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float = 0.0
) -> Array:
    """logits (B, T, V), targets (B, T) -> the mean loss over non-pad targets, a 0-d tensor."""
    check_loss_inputs(logits.shape, targets.shape, label_smoothing)
    check_token_ids("targets", targets, logits.shape[-1], None)
    # log-softmax is unchanged by a shift of the logits; shifting by the row max avoids
    # overflow. The shift is a constant (detached): no gradient flows through the max.
    # differs: framework-autograd
    shifted = logits - logits.amax(axis=-1, keepdims=True).detach()  # (B, T, V)
    log_probs = shifted - torch.log(torch.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    # -log p(target)
    nll = -torch.gather(log_probs, -1, targets[..., None])[..., 0]  # (B, T)
    smooth = -log_probs.mean(dim=-1)  # (B, T): -mean over the vocabulary of log p
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth  # (B, T)
    real = targets != pad_id  # (B, T): positions that count
    # differs: host-scalars
    count = real.sum().clamp(min=1)  # (): all padding: 0 / 1, not 0 / 0
    return torch.where(real, per_token, 0.0).sum() / count  # ()
