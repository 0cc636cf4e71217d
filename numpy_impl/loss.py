"""Token cross-entropy with padding and label smoothing; the same definition in every backend.

For one position with logits z (V,), log-probabilities log p = log_softmax(z) and target y:

    loss_t = (1 - eps) * -log p_y  +  eps * mean_v(-log p_v)

i.e. the cross-entropy against the smoothed distribution q = (1 - eps) onehot(y) + eps / V,
where the eps / V covers the whole vocabulary, the target and the padding id included
(``torch.nn.functional.cross_entropy(label_smoothing=eps)`` and ``optax.smooth_labels``
define it so; the paper's reference code spreads eps over V - 2 classes instead).

    loss = sum of loss_t over positions whose target is not pad_id / their number

A batch with no such position has loss 0 (and zero gradients), not 0 / 0 = NaN.
"""

from __future__ import annotations

import numpy as np
from numpy import ndarray as Array

from transformer_spec.checks import check_loss_inputs

from .checks import check_token_ids


def cross_entropy(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float = 0.0
) -> Array:
    """logits (B, T, V), targets (B, T) -> the mean loss over non-pad targets, a 0-d array."""
    check_loss_inputs(logits.shape, targets.shape, label_smoothing)
    check_token_ids("targets", targets, logits.shape[-1], None)
    # log-softmax is unchanged by a shift of the logits; shifting by the row max avoids overflow
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    # -log p(target)
    nll = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    smooth = -log_probs.mean(axis=-1)  # (B, T): -mean over the vocabulary of log p
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth  # (B, T)
    real = targets != pad_id  # (B, T): positions that count
    # a Python int, which keeps float32 float32
    count = max(int(real.sum()), 1)  # all padding: 0 / 1, not 0 / 0
    return np.where(real, per_token, 0.0).sum() / count  # ()


def cross_entropy_backward(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float = 0.0, grad_loss: float = 1.0
) -> Array:
    """-> grad_logits (B, T, V): (p - q) / count at counted positions, 0 at padding.

    With q the smoothed target distribution (1 - eps) onehot(y) + eps / V, loss_t is
    -sum_v q_v log p_v, and since sum_v q_v = 1 its gradient is d loss_t / dz = p - q.
    A function, not a module: it needs nothing kept from the forward but its inputs.
    """
    vocab_size = logits.shape[-1]
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    exp = np.exp(shifted)  # (B, T, V)
    probs = exp / exp.sum(axis=-1, keepdims=True)  # (B, T, V): softmax
    smoothed = np.full_like(probs, label_smoothing / vocab_size)  # (B, T, V): eps / V everywhere
    # q at the target: (1 - eps) + eps / V, written into the (B, T, 1) target entries of (B, T, V)
    at_target = 1.0 - label_smoothing + label_smoothing / vocab_size
    np.put_along_axis(smoothed, targets[..., None], at_target, axis=-1)
    real = targets != pad_id  # (B, T): positions that count
    count = max(int(real.sum()), 1)  # as in the forward
    # the mean's 1 / count at counted positions, 0 at padding
    return (probs - smoothed) * (grad_loss / count) * real[..., None]  # (B, T, V)
