"""Solutions to chapter 11's exercises (the loss): one function per exercise, named as the exercise."""

import numpy as np


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V): every exponent below is <= 0
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # log p = (z - m) - log sum exp(z - m)


def cross_entropy_loss(logits, targets, pad_id):
    log_p = log_softmax(logits)  # (B, T, V)
    nll = -np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # (B, T): -log p[target]
    real = targets != pad_id  # (B, T): the positions that count
    return np.where(real, nll, 0.0).sum() / max(real.sum(), 1)  # all padding: 0 / 1, not 0 / 0


def label_smoothed_loss(logits, targets, pad_id, label_smoothing):
    log_p = log_softmax(logits)  # (B, T, V)
    nll = -np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # (B, T): -log p[target]
    uniform = -log_p.mean(axis=-1)  # (B, T): eps / V on every class, the target included
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * uniform  # (B, T)
    real = targets != pad_id  # (B, T)
    return np.where(real, per_token, 0.0).sum() / max(real.sum(), 1)
