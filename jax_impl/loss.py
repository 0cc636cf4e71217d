"""Token cross-entropy with padding and label smoothing; the same definition in every backend.

For one position with logits z (V,), log-probabilities log p = log_softmax(z) and target y:

    loss_t = (1 - eps) * -log p_y  +  eps * mean_v(-log p_v)

i.e. the cross-entropy against the smoothed distribution q = (1 - eps) onehot(y) + eps / V,
where the eps / V covers the whole vocabulary, the target and the padding id included
(``torch.nn.functional.cross_entropy(label_smoothing=eps)`` and ``optax.smooth_labels``
define it so; the paper's reference code spreads eps over V - 2 classes instead).

    loss = sum of loss_t over positions whose target is not pad_id / their number

A batch with no such position has loss 0 (and zero gradients), not 0 / 0 = NaN. Its
gradient comes from ``jax.grad``; numpy_impl writes it by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from transformer_spec.checks import check_loss_inputs

from .checks import check_token_ids


def cross_entropy(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float = 0.0
) -> Array:
    """logits (B, T, V), targets (B, T) -> the mean loss over non-pad targets, a 0-d array."""
    check_loss_inputs(logits.shape, targets.shape, label_smoothing)
    check_token_ids("targets", targets, logits.shape[-1], None)
    # log-softmax is unchanged by a shift of the logits; shifting by the row max avoids
    # overflow. The shift is a constant (stop_gradient): no gradient flows through the max.
    shifted = logits - jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True))  # (B, T, V)
    log_probs = shifted - jnp.log(jnp.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    # -log p(target)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    smooth = -log_probs.mean(axis=-1)  # (B, T): -mean over the vocabulary of log p
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth  # (B, T)
    real = targets != pad_id  # (B, T): positions that count
    count = jnp.maximum(real.sum(), 1)  # (): all padding: 0 / 1, not 0 / 0
    return jnp.where(real, per_token, 0.0).sum() / count  # ()
