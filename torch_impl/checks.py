"""Reads shapes, dtypes and id ranges off torch tensors for transformer_spec.checks, and makes
what a model is given (its own tensors, lists, tuples, other frameworks' arrays) the tensors it
computes with."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from transformer_spec import checks


def check_token_ids(
    name: str, ids: torch.Tensor, vocab_size: int, max_len: int | None, offset: int = 0
) -> None:
    if checks.caller_checked():  # a caller checked this whole pass (inputs_checked)
        return
    checks.check_token_array(name, ids, vocab_size, max_len, offset)  # the values, read on the host


def check_mask(name: str, mask: torch.Tensor | None, expected: tuple[int, ...]) -> None:
    if mask is not None:
        dtype = checks.dtype_name(mask)
        checks.check_mask(name, mask.shape, dtype, dtype == "bool", expected)


def readable(name: str, x: Any) -> torch.Tensor | np.ndarray | None:
    """``x`` as an array whose shape, dtype and values the checks can read: this backend's own
    array as it is; a list, a tuple or another framework's array as ``np.asarray`` reads it, on
    the host."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    return checks.host_array(name, x)


def to_backend(x: torch.Tensor | np.ndarray | None, model: Any) -> torch.Tensor | None:
    """A checked input (``readable``'s) as the array ``model`` computes with, on its device."""
    # differs: torch-device
    return None if x is None else torch.as_tensor(x, device=device_of(model, x))


def device_of(model: Any, x: torch.Tensor | np.ndarray) -> torch.device:  # differs: torch-device
    """Where ``model`` keeps its weights (or buffers); a module holding neither (the source
    embeddings of a ``share_embeddings`` model without sinusoids) computes where ``x`` is."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


def token_ids(
    name: str, ids: Any, vocab_size: int, max_len: int | None, model: Any, offset: int = 0
) -> torch.Tensor:
    """ids as the model's lookup takes them, checked: every integer dtype, not bool."""
    if checks.caller_checked():  # a caller checked and converted them for this whole pass
        return ids
    ids = readable(name, ids)  # (B, T)
    check_token_ids(name, ids, vocab_size, max_len, offset)
    return to_backend(ids, model).long()  # (B, T); differs: torch-index-dtype


def attention_mask(
    name: str, mask: Any, expected: tuple[int, ...], model: Any
) -> torch.Tensor | None:
    """A mask (True = may attend) as the model takes it, checked against the scores' shape
    ``expected``."""
    mask = readable(name, mask)  # (B|1, H|1, T_q|1, T_k) or None
    check_mask(name, mask, expected)
    return to_backend(mask, model)


def check_float_inputs(
    names: tuple[str, ...], arrays: tuple[torch.Tensor, ...], module: Any = None
) -> None:
    """A component's float inputs in one dtype, and that of the module's weights (``module``;
    None for a function): refused otherwise, where NumPy would promote to float64, JAX cast to
    the weights' dtype and torch fail inside a matmul."""
    if checks.caller_checked():
        return
    if torch.is_autocast_enabled(arrays[0].device.type):  # differs: mixed-precision
        return  # autocast's bf16 activations beside the float32 weights are its design
    weights = None if module is None else weights_dtype(module)
    checks.check_float_inputs(names, tuple(checks.dtype_name(x) for x in arrays), weights)


def weights_dtype(module: Any) -> str:
    """The dtype of a module's weights (they share one: ``from_params`` checks it)."""
    # differs: framework-module-tree
    return checks.dtype_name(next(module.parameters()))
