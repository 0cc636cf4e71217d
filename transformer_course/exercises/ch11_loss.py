"""Chapter 11, the loss: token cross-entropy over the non-pad targets, with label smoothing."""

from __future__ import annotations

import numpy as np

from ..check import Exercise, Mistake

PAD = 0


def _targets(rng: np.random.Generator, batch: int, length: int, vocab: int, real: list[int]) -> np.ndarray:
    """(B, T) target ids in 1..vocab-1, row b padded (PAD = 0) after its first real[b] positions."""
    targets = rng.integers(1, vocab, size=(batch, length))
    for row, count in enumerate(real):
        targets[row, count:] = PAD
    return targets


def _cases(label_smoothing: float | None):
    """Ordinary, overflowing and all-padding batches, and one padded with another id (0 a real target,
    a stronger smoothing); with ``label_smoothing`` None, no such argument."""
    rng = np.random.default_rng(11)
    smoothing = {} if label_smoothing is None else {"label_smoothing": label_smoothing}
    other_pad = 3
    other = np.array([[0, 5, 0, 2, other_pad], [1, 0, other_pad, other_pad, other_pad]])  # 0: a word here
    another = {"logits": 2.0 * rng.standard_normal((2, 5, 6)), "targets": other, "pad_id": other_pad,
               **({} if label_smoothing is None else {"label_smoothing": 0.25})}  # fmt: skip
    ordinary = {"logits": 3.0 * rng.standard_normal((3, 7, 11)),
                "targets": _targets(rng, 3, 7, 11, [7, 5, 2]), "pad_id": PAD, **smoothing}  # fmt: skip
    large = {"logits": 1000.0 + 30.0 * rng.standard_normal((2, 4, 9)),  # exp(1000) overflows float64
             "targets": _targets(rng, 2, 4, 9, [4, 3]), "pad_id": PAD, **smoothing}  # fmt: skip
    padding = {"logits": 3.0 * rng.standard_normal((2, 3, 5)), "targets": np.full((2, 3), PAD), "pad_id": PAD,
               **smoothing}  # fmt: skip
    return [
        ("(3, 7, 11): 3 sequences with 7, 5 and 2 real targets, the rest padding", ordinary),
        ("large logits, around 1000 (exp overflows float64)", large),
        ("a batch of padding only: no target counts", padding),
        ("pad id 3, where 0 is an ordinary target" + ("" if label_smoothing is None else ", eps = 0.25"), another),
    ]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _naive_log_softmax(logits: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        exp = np.exp(logits)  # inf where a logit is above 709
        return np.log(exp / exp.sum(axis=-1, keepdims=True))  # inf / inf = NaN


def _per_token(
    log_probs: np.ndarray, targets: np.ndarray, eps: float, spread: str = "all", pad_id: int = PAD
) -> np.ndarray:
    """(B, T) cross-entropy against the smoothed target: eps over all V classes, or over the V - 1 others
    ("others"), or over the V - 2 classes that are neither the target nor padding ("others_not_pad")."""
    vocab = log_probs.shape[-1]
    nll = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    total = -log_probs.sum(axis=-1)  # (B, T): sum over the vocabulary of -log p
    if spread == "all":
        smooth = total / vocab
    elif spread == "others":
        smooth = (total - nll) / (vocab - 1)
    else:
        smooth = (total - nll + log_probs[..., pad_id]) / (vocab - 2)
    return (1.0 - eps) * nll + eps * smooth


def _mean_over_real(per_token: np.ndarray, targets: np.ndarray, pad_id: int) -> np.ndarray:
    real = targets != pad_id
    return np.asarray(np.where(real, per_token, 0.0).sum() / max(int(real.sum()), 1))


# ------------------------------------------------------------------ cross_entropy_loss
def _ce_batch_mean(logits, targets, pad_id):
    per_token = _per_token(_log_softmax(logits), targets, 0.0)
    return np.asarray(np.where(targets != pad_id, per_token, 0.0).sum() / targets.shape[0])


def _ce_padding_counted(logits, targets, pad_id):
    return np.asarray(_per_token(_log_softmax(logits), targets, 0.0).mean())


def _ce_sum(logits, targets, pad_id):
    per_token = _per_token(_log_softmax(logits), targets, 0.0)
    return np.asarray(np.where(targets != pad_id, per_token, 0.0).sum())


def _ce_pad_zero(logits, targets, pad_id):
    return _mean_over_real(_per_token(_log_softmax(logits), targets, 0.0), targets, 0)  # 0, not pad_id


# ------------------------------------------------------------------ label_smoothed_loss
def _ls_padding_counted(logits, targets, pad_id, label_smoothing):
    return np.asarray(_per_token(_log_softmax(logits), targets, label_smoothing).mean())


def _ls_others(logits, targets, pad_id, label_smoothing):
    per_token = _per_token(_log_softmax(logits), targets, label_smoothing, spread="others")
    return _mean_over_real(per_token, targets, pad_id)


def _ls_others_not_pad(logits, targets, pad_id, label_smoothing):
    per_token = _per_token(_log_softmax(logits), targets, label_smoothing, spread="others_not_pad", pad_id=pad_id)
    return _mean_over_real(per_token, targets, pad_id)


def _ls_pad_zero(logits, targets, pad_id, label_smoothing):
    return _mean_over_real(_per_token(_log_softmax(logits), targets, label_smoothing), targets, 0)  # 0, not pad_id


def _ls_naive(logits, targets, pad_id, label_smoothing):
    with np.errstate(invalid="ignore"):
        per_token = _per_token(_naive_log_softmax(logits), targets, label_smoothing)
        return _mean_over_real(per_token, targets, pad_id)


EXERCISES = [
    Exercise(
        name="cross_entropy_loss",
        chapter="11_loss",
        task="cross_entropy_loss(logits, targets, pad_id) -> a 0-d array: logits (B, T, V), targets (B, T) ids; "
        "the mean of -log softmax(logits)[target] over the positions whose target is not pad_id (0 when there "
        "are none). The backends' cross_entropy with label_smoothing = 0.",
        cases=lambda: _cases(None),
        expected=lambda b, x: b.call(b.impl.cross_entropy, x["logits"], x["targets"], x["pad_id"], 0.0),
        mistakes=(
            Mistake(
                "the mean over the batch",
                "The loss is the mean over the *tokens* that count, not over the sequences: divide the sum by the "
                "number of non-pad targets, (targets != pad_id).sum(), not by B. Divided by B, the loss (and the "
                "learning rate it implies) grows with the length of the sentences.",
                _ce_batch_mean,
            ),
            Mistake(
                "padding not ignored",
                "Positions whose target is pad_id are not words to predict: leave them out of the sum *and* of "
                "the count (F.cross_entropy's ignore_index=pad_id). A plain mean over all B * T positions trains "
                "the model to predict padding.",
                _ce_padding_counted,
            ),
            Mistake(
                "the sum, not the mean",
                "Divide the summed -log p by the number of non-pad targets: a summed loss scales the gradients "
                "(and so the step size) with the batch.",
                _ce_sum,
            ),
            Mistake(
                "the pad id written as 0",
                "Leave out the positions whose target is the pad_id you are given (targets != pad_id): 0 pads "
                "BERT's batches, but other vocabularies pad with another id and 0 is a word to predict.",
                _ce_pad_zero,
            ),
        ),
    ),
    Exercise(
        name="label_smoothed_loss",
        chapter="11_loss",
        task="label_smoothed_loss(logits, targets, pad_id, label_smoothing) -> a 0-d array: the cross-entropy "
        "against q = (1 - eps) onehot(target) + eps / V (eps / V on every class, the target and padding "
        "included), i.e. per position (1 - eps) * -log p[target] + eps * mean over the vocabulary of -log p, "
        "with log p the log-softmax of the logits (B, T, V) computed without overflow; the mean over the "
        "non-pad targets (0 when there are none).",
        cases=lambda: _cases(0.1),
        expected=lambda b, x: b.call(
            b.impl.cross_entropy, x["logits"], x["targets"], x["pad_id"], x["label_smoothing"]
        ),  # fmt: skip
        mistakes=(
            Mistake(
                "padding counted in the mean",
                "A position whose target is pad_id predicts nothing: leave its loss out of the sum and out of "
                "the count. Average over (targets != pad_id) only, and give a batch with no such position 0, "
                "not 0 / 0.",
                _ls_padding_counted,
            ),
            Mistake(
                "smoothing spread over the V - 1 other classes",
                "This project, torch's F.cross_entropy(label_smoothing=eps) and optax.smooth_labels put eps / V on "
                "*every* class, the target included (so the target gets 1 - eps + eps / V). Spreading eps over "
                "the V - 1 other classes is a common variant, but a different loss: use the mean of -log p over "
                "the whole vocabulary.",
                _ls_others,
            ),
            Mistake(
                "smoothing spread over V - 2 classes (neither target nor padding)",
                "Some translation codebases also keep the smoothing mass off the padding column and spread eps "
                "over V - 2 classes. The convention here is eps / V on every class: the mean of -log p over the "
                "whole vocabulary.",
                _ls_others_not_pad,
            ),
            Mistake(
                "log of a softmax that overflows",
                "Computed as np.log(np.exp(z) / np.exp(z).sum()), the log-softmax overflows for logits above 709 "
                "(inf / inf = NaN). Compute it directly from the logits shifted by their row max m: log p = "
                "(z - m) - log(sum(exp(z - m))), where every exponent is <= 0.",
                _ls_naive,
            ),
            Mistake(
                "the pad id written as 0",
                "Leave out the positions whose target is the pad_id you are given (targets != pad_id): 0 pads "
                "BERT's batches, but other vocabularies pad with another id and 0 is a word to predict.",
                _ls_pad_zero,
            ),
        ),
    ),
]
