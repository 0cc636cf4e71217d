"""bf16 mixed precision in NumPy, emulated: float32 master weights, ``ml_dtypes.bfloat16`` compute.

NumPy has no autocast and no compute dtype. ``ml_dtypes`` gives it a bfloat16 dtype, but with
NumPy's own promotion rules (bf16 * 2.0 is float32, bf16 @ bf16 is float32), which are neither
torch's nor JAX's. So the model's weights are swapped, for the duration of the pass, for views
of class ``Bf16Compute``: an array whose every op computes in float32 and rounds its result to the
dtype the frameworks give it (transformer_run.mixed_precision has the two policies):

- a matmul rounds its operands to bf16, accumulates in float32 and returns bf16 (torch.autocast's
  and XLA's bf16 GEMM);
- any other op returns the dtype torch and JAX promote its array operands to (bf16 with bf16 is
  bf16, bf16 with float32 is float32); Python scalars and 0-d values do not promote, as in both;
- a reduction (sum, mean, max) accumulates in float32 and rounds once.

Every array an op returns is again a ``Bf16Compute``, so the teaching code (forward and hand-
written backward) runs unchanged: the same text, computing what the frameworks compute.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import ml_dtypes
import numpy as np

from transformer_run.batches import split_batch
from transformer_run.mixed_precision import check_compute_dtype, check_master_dtype, check_policy
from transformer_spec import param_schema
from transformer_spec.checks import inputs_checked
from transformer_spec.kernels import fused_kernels

from .layers import Linear
from .loss import cross_entropy, cross_entropy_backward
from .module import enable_grad, named_submodules

BF16 = np.dtype(ml_dtypes.bfloat16)
# the float dtypes this emulates, narrowest first
_FLOATS = (BF16, np.dtype(np.float32), np.dtype(np.float64))


def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, Bf16Compute) else x


def _result_dtype(operands: tuple) -> np.dtype | None:
    """The widest float dtype among the operands that have dimensions (None if there is none):
    bf16 with float32 gives float32, as torch's and JAX's promotion do; scalars do not count."""
    found = [
        np.dtype(x.dtype)
        for x in operands
        if isinstance(x, np.ndarray) and x.ndim > 0 and x.dtype in _FLOATS
    ]
    return max(found, key=_FLOATS.index) if found else None


def _in_float32(x: Any) -> Any:
    """bf16 arrays computed in float32; 0-d arrays and NumPy scalars as Python numbers (weak:
    they do not promote)."""
    x = _plain(x)
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype in _FLOATS:
        return float(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray) and x.dtype == BF16:
        return x.astype(np.float32)
    return x


def _wrap(result: Any, dtype: np.dtype | None) -> Any:
    if isinstance(result, tuple):
        return tuple(_wrap(r, dtype) for r in result)
    # (bf16's dtype kind is "V", not "f")
    if isinstance(result, np.ndarray) and result.dtype in _FLOATS:
        return result.astype(dtype or result.dtype, copy=False).view(Bf16Compute)
    return result


class Bf16Compute(np.ndarray):
    """An array whose ops compute in float32 and round to the dtype torch and JAX give them
    (module docstring)."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if ufunc is np.matmul and method == "__call__":
            # A bf16 GEMM: operands rounded to bf16, products summed in float32, the result
            # rounded to bf16.
            a, b = (np.asarray(_plain(x)).astype(BF16).astype(np.float32) for x in inputs)
            result, dtype = np.matmul(a, b, **kwargs), BF16
        else:
            dtype = _result_dtype(inputs)
            kwargs.pop("dtype", None)  # a reduction accumulates in float32 here, whatever was asked
            # in place on inputs[0] (np.add.at: the embedding's gradient rows), in float32
            if method == "at":
                target = np.asarray(_plain(inputs[0]))
                accumulated = target.astype(np.float32) if target.dtype == BF16 else target
                ufunc.at(accumulated, *(_in_float32(x) for x in inputs[1:]), **kwargs)
                target[...] = accumulated.astype(target.dtype)
                return None
            result = getattr(ufunc, method)(*(_in_float32(x) for x in inputs), **kwargs)
            if method == "reduce" and dtype is None and isinstance(inputs[0], np.ndarray):
                dtype = np.dtype(inputs[0].dtype) if inputs[0].dtype in _FLOATS else None
        if out is not None:
            results = result if isinstance(result, tuple) else (result,)
            for target, value in zip(out, results, strict=True):
                _plain(target)[...] = np.asarray(value).astype(target.dtype)
            return out[0] if len(out) == 1 else out
        return _wrap(result, dtype)

    def __array_function__(self, func, types, args, kwargs):
        plain_args = tuple(
            _plain(a) if not isinstance(a, (list, tuple)) else type(a)(map(_plain, a)) for a in args
        )
        plain_kwargs = {k: _plain(v) for k, v in kwargs.items()}
        if func is np.where and len(args) == 3:
            # np.where(mask, bf16 scores, -inf) stays bf16 (NumPy would widen it to float64)
            dtype = _result_dtype(args[1:])
            result = func(plain_args[0], *(_in_float32(a) for a in plain_args[1:]))
            return _wrap(result, dtype)
        result = func(*plain_args, **plain_kwargs)
        return _wrap(result, None)


def _float_arrays(model) -> list[tuple[object, str, np.ndarray]]:
    """(module, attribute, array) for every float array a module of ``model`` holds: weights and
    buffers."""
    found = []
    for _, module in named_submodules(model):
        for attr, value in vars(module).items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                found.append((module, attr, value))
    return found


@contextmanager
def compute_in_bf16(model, policy: str | None = None) -> Iterator[None]:
    """Inside: ``model`` computes in bf16 as ``policy`` says (None: NumPy's default, the first of
    ``BACKEND_POLICY["numpy"]``), its float32 weights kept aside and put back after.

    ``"autocast"``: a Linear layer's weight and bias are rounded to bf16 (as torch.autocast casts
    them for each linear call); every other array (embeddings, norms, positional tables) stays
    float32. ``"compute_dtype"``: every float array is rounded to bf16 (Flax's ``dtype``).

    The swap is in place, as torch.autocast is a mode: another thread calling the same model inside
    the block computes in bf16 too (give each thread its own model, as with any training run)."""
    policy = check_policy("numpy", policy)
    held = _float_arrays(model)
    check_master_dtype(str(held[0][2].dtype))
    linear = {id(module) for _, module in named_submodules(model) if isinstance(module, Linear)}
    try:
        for module, attr, value in held:
            cast = policy == "compute_dtype" or id(module) in linear
            setattr(module, attr, (value.astype(BF16) if cast else value).view(Bf16Compute))
        # the kernels call BLAS in float32: the written-out math is what is emulated
        with fused_kernels(False):
            yield
    finally:
        for module, attr, value in held:
            setattr(module, attr, value)


def mixed_precision_logits(
    model, *inputs, compute_dtype: str = "bfloat16", policy: str | None = None
) -> np.ndarray:
    """The model's logits (float32) on ``inputs`` (as the model takes them), computed in bf16
    under ``policy``."""
    check_compute_dtype(compute_dtype)
    checked = model.check_inputs(*inputs)  # on the float32 model, before any weight is swapped
    with compute_in_bf16(model, policy), inputs_checked():
        logits = model(*checked).logits  # (B, T, V)
    return np.asarray(_plain(logits)).astype(np.float32)


def mixed_precision_loss_and_grads(
    model,
    batch: Mapping[str, np.ndarray],
    label_smoothing: float = 0.0,
    compute_dtype: str = "bfloat16",
    policy: str | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """``training.loss_and_grads`` with the passes in bf16: the loss (in float32, from the float32
    logits) and float32 gradients for the float32 master weights."""
    check_compute_dtype(compute_dtype)
    inputs, targets = split_batch(model.config, batch)
    checked = model.check_inputs(*(np.asarray(x) for x in inputs))
    targets = np.asarray(targets)  # (B, T)
    with compute_in_bf16(model, policy), inputs_checked():
        with enable_grad():  # every module keeps what its backward needs
            logits = np.asarray(_plain(model(*checked).logits)).astype(np.float32)  # (B, T, V)
        loss = cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # (), float32
        grad_logits = cross_entropy_backward(
            logits, targets, model.config.pad_id, label_smoothing
        )  # (B, T, V)
        _, grads = model.backward(grad_logits.view(Bf16Compute))
    names = param_schema(model.config)
    return float(loss), {name: np.asarray(_plain(grads[name])).astype(np.float32) for name in names}
