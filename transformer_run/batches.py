"""Training batches: the one dict every backend's ``loss_and_grads`` takes.

A batch is a dict of integer (B, T) token-id arrays (NumPy, or the backend's own):

    encoder_decoder:  {"src_ids": (B, T_src), "tgt_in": (B, T_tgt), "tgt_out": (B, T_tgt)}
    decoder_only:     {"ids": (B, T), "targets": (B, T)}

The targets are the inputs shifted left by one ("teacher forcing"): ``tgt_out[:, t]`` is
the token the model must predict after reading ``tgt_in[:, : t + 1]``. Both are cut from
one sequence of T + 1 tokens by :func:`shift_targets`; for translation that sequence is
``<bos> y_1 ... y_n <eos>`` padded, so ``tgt_in`` starts with <bos> and ``tgt_out`` ends
with <eos>. Positions whose target is ``config.pad_id`` are left out of the loss.

An encoder-only model has no next-token logits: it has no batch here and no loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer_spec.checks import check_same_shape
from transformer_spec.config import Config

BATCH_KEYS = {
    "encoder_decoder": ("src_ids", "tgt_in", "tgt_out"),
    "decoder_only": ("ids", "targets"),
}


def shift_targets(ids: Any) -> tuple[Any, Any]:
    """(B, T + 1) sequences -> inputs ``ids[:, :-1]`` and targets ``ids[:, 1:]``, each (B, T)."""
    if len(ids.shape) != 2 or ids.shape[1] < 2:
        raise ValueError(
            f"shift_targets needs (batch, seq_len) ids with seq_len >= 2 (an input and a next token), "
            f"got shape {tuple(ids.shape)}"
        )
    return ids[:, :-1], ids[:, 1:]


def decoder_only_batch(ids: Any) -> dict[str, Any]:
    """A language-model batch from (B, T + 1) sequences: {"ids": (B, T), "targets": (B, T)}."""
    inputs, targets = shift_targets(ids)
    return {"ids": inputs, "targets": targets}


def encoder_decoder_batch(src_ids: Any, tgt_ids: Any) -> dict[str, Any]:
    """A translation batch from source ids (B, T_src) and target sequences (B, T_tgt + 1)."""
    tgt_in, tgt_out = shift_targets(tgt_ids)
    return {"src_ids": src_ids, "tgt_in": tgt_in, "tgt_out": tgt_out}


def split_batch(config: Config, batch: Mapping[str, Any]) -> tuple[tuple[Any, ...], Any]:
    """-> (the model's positional inputs, the targets): ((src_ids, tgt_in), tgt_out) or ((ids,), targets)."""
    if config.kind not in BATCH_KEYS:
        raise ValueError(
            f"loss_and_grads needs a model with a decoder (kind 'encoder_decoder' or 'decoder_only'): its loss "
            f"is next-token cross-entropy over the logits, and a {config.kind!r} model has no logits"
        )
    keys = BATCH_KEYS[config.kind]
    if set(batch) != set(keys):
        raise ValueError(f"a {config.kind} batch is a dict with keys {list(keys)}, got keys {sorted(batch)}")
    *inputs, targets = (batch[key] for key in keys)
    check_same_shape((keys[-1], keys[-2]), (targets.shape, inputs[-1].shape))
    return tuple(inputs), targets
