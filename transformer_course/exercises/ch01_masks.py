"""Chapter 1, masks: which key each query may attend to (True = may attend)."""

from __future__ import annotations

import numpy as np

from ..check import Exercise, Mistake

PAD = 0


def _ids() -> np.ndarray:
    return np.array([[5, 7, 9, PAD, PAD], [3, 4, 8, 6, 2], [PAD, PAD, 1, 2, 3]])  # right, none, left padding


def _cases():
    """Pad id 0 (BERT's, the paper's here), then another: id 1 pads (RoBERTa's, Marian's have their own)
    and id 0 is an ordinary token, so an answer that wrote 0 instead of pad_id hides the wrong keys."""
    other = np.array([[0, 4, 0, 1], [2, 0, 1, 1]])  # right padding with 1; 0 a token like any other
    return [
        ("right, no and left padding", {"ids": _ids(), "pad_id": PAD}),
        ("pad id 1, where 0 is an ordinary token", {"ids": other, "pad_id": 1}),
    ]


EXERCISES = [
    Exercise(
        name="causal_mask",
        chapter="01_masks",
        task="causal_mask(seq_len) -> (1, 1, T, T) bool: position i may attend to positions 0..i.",
        cases=lambda: [("T = 5", {"seq_len": 5}), ("T = 1", {"seq_len": 1})],
        expected=lambda b, x: b.call(b.impl.make_causal_mask, x["seq_len"]),
        mistakes=(
            Mistake(
                "the mask's polarity",
                "True means *may attend* here (as in F.scaled_dot_product_attention and Flax); "
                "torch.nn.Transformer's masks read True as *hidden*. Use np.tril, not np.triu(k=1).",
                lambda seq_len: np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)[None, None],
            ),
            Mistake(
                "the diagonal hidden",
                "a position may attend to itself: np.tril(..., k=0). With k=-1 the first row hides "
                "every key and its softmax is 0/0.",
                lambda seq_len: np.tril(np.ones((seq_len, seq_len), dtype=bool), k=-1)[None, None],
            ),
            Mistake(
                "no batch and head axes",
                "the mask broadcasts against scores of shape (B, H, T, T): give it shape (1, 1, T, T).",
                lambda seq_len: np.tril(np.ones((seq_len, seq_len), dtype=bool)),
            ),
        ),
    ),
    Exercise(
        name="padding_mask",
        chapter="01_masks",
        task="padding_mask(ids, pad_id) -> (B, 1, 1, T) bool: every query may attend to every key "
        "that is not padding.",
        cases=_cases,
        expected=lambda b, x: b.call(b.impl.make_padding_mask, x["ids"], x["pad_id"]),
        mistakes=(
            Mistake(
                "the mask's polarity",
                "True means *may attend*: the mask is ids != pad_id (torch.nn's key_padding_mask is "
                "the opposite, True = padding).",
                lambda ids, pad_id: (ids == pad_id)[:, None, None, :],
            ),
            Mistake(
                "padding hidden as queries instead of keys",
                "the mask hides padded *keys* (the last axis); shape (B, 1, 1, T), not (B, 1, T, 1). "
                "A padded query's row is never read.",
                lambda ids, pad_id: (ids != pad_id)[:, None, :, None],
            ),
            Mistake(
                "the pad id written as 0",
                "compare with the pad_id you are given: 0 pads BERT's batches, but other vocabularies pad with "
                "another id and use 0 for a real token (ids != pad_id, not ids != 0).",
                lambda ids, pad_id: (ids != 0)[:, None, None, :],
            ),
            Mistake(
                "no head and query axes",
                "the scores are (B, H, T_q, T_k): give the mask shape (B, 1, 1, T) so it broadcasts.",
                lambda ids, pad_id: ids != pad_id,
            ),
        ),
    ),
    Exercise(
        name="decoder_mask",
        chapter="01_masks",
        task="decoder_mask(ids, pad_id) -> (B, 1, T, T) bool: causal AND the key is not padding.",
        cases=_cases,
        expected=lambda b, x: b.call(b.impl.make_decoder_mask, x["ids"], x["pad_id"]),
        mistakes=(
            Mistake(
                "OR instead of AND",
                "a key is visible only when both masks allow it: combine them with &, not |.",
                lambda ids, pad_id: (
                    (ids != pad_id)[:, None, None, :] | np.tril(np.ones((ids.shape[1],) * 2, dtype=bool))[None, None]
                ),
            ),
            Mistake(
                "padding forgotten",
                "the causal mask alone lets a query attend to padded keys before it (left padding); "
                "AND it with the padding mask.",
                lambda ids, pad_id: np.broadcast_to(
                    np.tril(np.ones((ids.shape[1],) * 2, dtype=bool)), (ids.shape[0], 1, ids.shape[1], ids.shape[1])
                ),
            ),
            Mistake(
                "the pad id written as 0",
                "compare with the pad_id you are given: 0 pads BERT's batches, but other vocabularies pad with "
                "another id and use 0 for a real token (ids != pad_id, not ids != 0).",
                lambda ids, pad_id: (ids != 0)[:, None, None, :] & np.tril(np.ones((ids.shape[1],) * 2, dtype=bool)),
            ),
        ),
    ),
]
