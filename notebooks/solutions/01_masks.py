"""Solutions to chapter 1's exercises (the masks): one function per exercise, named as the exercise."""

import numpy as np


def causal_mask(seq_len):
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))[None, None, :, :]  # (1, 1, T, T)


def padding_mask(ids, pad_id):
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T): the keys that are not padding


def decoder_mask(ids, pad_id):
    return padding_mask(ids, pad_id) & causal_mask(ids.shape[1])  # (B, 1, T, T)
