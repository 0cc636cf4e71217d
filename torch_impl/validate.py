"""Reads shapes, dtypes and id ranges off torch tensors for transformer_spec.checks."""

from __future__ import annotations

import torch

from transformer_spec import checks


def _dtype(x: torch.Tensor) -> str:  # differs: framework-dtype-names
    return str(x.dtype).removeprefix("torch.")


def check_token_ids(name: str, ids: torch.Tensor, vocab_size: int, max_len: int | None, offset: int = 0) -> None:
    if checks.caller_checked():  # a model checked them at its entry
        return
    # differs: framework-dtype-names
    is_integer = not ids.dtype.is_floating_point and not ids.dtype.is_complex and ids.dtype != torch.bool
    checks.check_token_ids(name, ids.shape, _dtype(ids), is_integer, vocab_size, max_len, offset)
    # torch raises on out-of-range ids too, but with an index error that names no id.
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    checks.check_token_id_range(name, torch.unique(bad).tolist() if bad.numel() else [], vocab_size)


def check_mask(name: str, mask: torch.Tensor | None, expected: tuple[int, ...]) -> None:
    if mask is not None:
        # differs: framework-dtype-names
        checks.check_mask(name, mask.shape, _dtype(mask), mask.dtype == torch.bool, expected)
