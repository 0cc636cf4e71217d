"""Reads shapes, dtypes and id ranges off NumPy arrays for transformer_spec.checks."""

from __future__ import annotations

import numpy as np

from transformer_spec import checks


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int, max_len: int | None, offset: int = 0) -> None:
    if checks.caller_checked():  # a model checked them at its entry
        return
    checks.check_token_ids(
        name, ids.shape, str(ids.dtype), np.issubdtype(ids.dtype, np.integer), vocab_size, max_len, offset
    )
    # NumPy would raise on ids >= vocab_size but silently wrap negative ids around.
    bad = np.unique(ids[(ids < 0) | (ids >= vocab_size)])
    checks.check_token_id_range(name, bad.tolist(), vocab_size)


def check_mask(name: str, mask: np.ndarray | None, expected: tuple[int, ...]) -> None:
    if mask is not None:
        checks.check_mask(name, mask.shape, str(mask.dtype), mask.dtype == np.bool_, expected)
