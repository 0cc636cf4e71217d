"""Reads shapes, dtypes and id ranges off NumPy arrays for transformer_spec.checks, and makes
what a model is given (its own arrays, lists, tuples, other frameworks' arrays) the arrays it
computes with."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_spec import checks

from .module import named_submodules


def check_token_ids(
    name: str, ids: np.ndarray, vocab_size: int, max_len: int | None, offset: int = 0
) -> None:
    if checks.caller_checked():  # a caller checked this whole pass (inputs_checked)
        return
    checks.check_token_array(name, ids, vocab_size, max_len, offset)  # the values, read on the host


def check_mask(name: str, mask: np.ndarray | None, expected: tuple[int, ...]) -> None:
    if mask is not None:
        dtype = checks.dtype_name(mask)
        checks.check_mask(name, mask.shape, dtype, dtype == "bool", expected)


def readable(name: str, x: Any) -> np.ndarray | None:
    """``x`` as an array whose shape, dtype and values the checks can read: this backend's own
    array as it is; a list, a tuple or another framework's array as ``np.asarray`` reads it, on
    the host."""
    if x is None or isinstance(x, np.ndarray):
        return x
    return checks.host_array(name, x)


def to_backend(x: np.ndarray | None, model: Any) -> np.ndarray | None:
    """A checked input (``readable``'s) as the array ``model`` computes with: already NumPy's."""
    return None if x is None else x  # differs: torch-device


def token_ids(
    name: str, ids: Any, vocab_size: int, max_len: int | None, model: Any, offset: int = 0
) -> np.ndarray:
    """ids as the model's lookup takes them, checked: every integer dtype, not bool."""
    if checks.caller_checked():  # a caller checked and converted them for this whole pass
        return ids
    ids = readable(name, ids)  # (B, T)
    check_token_ids(name, ids, vocab_size, max_len, offset)
    return to_backend(ids, model)  # (B, T)


def attention_mask(
    name: str, mask: Any, expected: tuple[int, ...], model: Any
) -> np.ndarray | None:
    """A mask (True = may attend) as the model takes it, checked against the scores' shape
    ``expected``."""
    mask = readable(name, mask)  # (B|1, H|1, T_q|1, T_k) or None
    check_mask(name, mask, expected)
    return to_backend(mask, model)


def check_float_inputs(
    names: tuple[str, ...], arrays: tuple[np.ndarray, ...], module: Any = None
) -> None:
    """A component's float inputs in one dtype, and that of the module's weights (``module``;
    None for a function): refused otherwise, where NumPy would promote to float64, JAX cast to
    the weights' dtype and torch fail inside a matmul."""
    if checks.caller_checked():
        return
    weights = None if module is None else weights_dtype(module)
    checks.check_float_inputs(names, tuple(checks.dtype_name(x) for x in arrays), weights)


def weights_dtype(module: Any) -> str:
    """The dtype of a module's weights (they share one: ``from_params`` checks it)."""
    # differs: framework-module-tree
    parameters = [
        v
        for _, m in named_submodules(module)
        for v in vars(m).values()
        if isinstance(v, np.ndarray)
    ]
    return checks.dtype_name(parameters[0])
