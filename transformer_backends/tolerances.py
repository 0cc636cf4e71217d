"""How close two backends' outputs must be: the one table the test suite and the CLI share.

Agreement is measured relative to the *scale* of the reference output:
``max |got - want| <= tol * max |want|``. Per-element relative error would be
meaningless where the reference is near zero (a softmax weight of 1e-9, a pre-norm
residual that happens to cross zero), while a scale-relative bound says "these tensors
agree to k significant digits of their magnitude".

- float64: 1e-12. The three backends evaluate the same formulas in the same order;
  what differs is summation order inside BLAS/XLA kernels, worth a few ulp (2.2e-16)
  per reduction. Measured worst cases are ~1e-15; 1e-12 leaves room for deeper stacks
  and still catches any real bug (a wrong eps, a missing bias: >= 1e-6).
- float32: 1e-5 (about 80 ulp of 1.2e-7). The inputs and weights are the float64
  reference's, rounded to float32; errors then grow with depth and post-norm. Measured
  worst cases on these small configs are ~1e-6.

Deep stacks: float32 rounding errors add up layer after layer, roughly as a random walk,
so ``tolerance(dtype, layers)`` widens the float32 bound by sqrt(layers / 2) beyond two
layers (the suite's configs have two): SmolLM2's 30 layers get 3.9e-5. Measured there:
JAX float32 reaches 1.3e-5 of the residual stream at layer 29, torch 2e-6 on the logits.
float64 keeps 1e-12 at any depth (its measured worst is ~1e-14 at 30 layers).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TOLERANCE", "max_relative_difference", "tolerance"]

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def tolerance(dtype: str, layers: int = 2) -> float:
    """The bound for ``dtype`` in a stack of ``layers`` layers (encoder + decoder): TOLERANCE[dtype],
    float32's widened by sqrt(layers / 2) beyond two layers (see the module docstring)."""
    if dtype == "float32" and layers > 2:
        return TOLERANCE[dtype] * float(np.sqrt(layers / 2))
    return TOLERANCE[dtype]


def max_relative_difference(got, want) -> float:
    """max |got - want| / max |want| (the plain max |got - want| where want is all zero).

    Raises AssertionError on a shape mismatch or a non-finite value in ``got``."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != reference shape {want.shape}")
    if not np.all(np.isfinite(got)):
        raise AssertionError(f"non-finite values in output: {int((~np.isfinite(got)).sum())} elements")
    scale = float(np.abs(want).max()) if want.size else 0.0
    diff = float(np.abs(got - want).max()) if want.size else 0.0
    return diff / scale if scale > 0 else diff
