"""The one tolerance table of the suite, and the comparison every test uses.

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
"""

from __future__ import annotations

import numpy as np

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}

# Worst error seen per (backend, reference, dtype) in this run, printed at the end of the
# session (conftest.py sets ``current_backend`` for each test; oracle modules name theirs).
WORST: dict[tuple[str, str, str], tuple[float, str]] = {}
current_backend = {"name": "-", "test": "", "oracle": "numpy float64"}


def max_relative_difference(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != reference shape {want.shape}")
    if not np.all(np.isfinite(got)):
        raise AssertionError(f"non-finite values in output: {int((~np.isfinite(got)).sum())} elements")
    scale = float(np.abs(want).max()) if want.size else 0.0
    diff = float(np.abs(got - want).max()) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def assert_close(got, want, dtype: str, what: str = "output") -> float:
    """Assert ``got`` matches ``want`` within the table's tolerance for ``dtype``; return the error."""
    error = max_relative_difference(got, want)
    tol = TOLERANCE[str(dtype)]
    key = (current_backend["name"], current_backend["oracle"], str(dtype))
    if error > WORST.get(key, (-1.0, ""))[0]:
        WORST[key] = (error, f"{current_backend['test']}: {what}")
    assert error <= tol, f"{what}: max |diff| / max |reference| = {error:.3e} > {tol:.0e} ({dtype})"
    return error
