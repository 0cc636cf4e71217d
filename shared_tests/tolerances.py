"""The suite's tolerance checks and the records of the worst errors they saw.

The table itself, and why its numbers are what they are: ``transformer_backends.tolerances``
(the CLI's ``trace`` holds backends to the same table).
"""

from __future__ import annotations

import numpy as np

from transformer_backends.tolerances import TOLERANCE, max_relative_difference  # noqa: F401 (re-exported)

# Worst error seen per (backend, reference, dtype) in this run, printed at the end of the
# session (conftest.py sets ``current_backend`` for each test; oracle modules name theirs).
WORST: dict[tuple[str, str, str], tuple[float, str]] = {}
current_backend = {"name": "-", "test": "", "nodeid": "", "oracle": "numpy float64"}

# Every check of this run, per test, kept for ``pytest --parity-json PATH`` (conftest.py writes
# it; the docs site shows it per component): (test node id, check, dtype) -> [worst error,
# number of comparisons, tolerance, backend, reference].
PARITY: dict[tuple[str, str, str], list] = {}


def record_parity(check: str, dtype: str, error: float, tolerance: float) -> None:
    key = (current_backend["nodeid"], check, str(dtype))
    entry = PARITY.setdefault(key, [0.0, 0, tolerance, current_backend["name"], current_backend["oracle"]])
    entry[0], entry[1] = max(entry[0], error), entry[1] + 1


def assert_close(got, want, dtype: str, what: str = "output") -> float:
    """Assert ``got`` matches ``want`` within the table's tolerance for ``dtype``; return the error."""
    error = max_relative_difference(got, want)
    tol = TOLERANCE[str(dtype)]
    key = (current_backend["name"], current_backend["oracle"], str(dtype))
    if error > WORST.get(key, (-1.0, ""))[0]:
        WORST[key] = (error, f"{current_backend['test']}: {what}")
    record_parity("output", str(dtype), error, tol)
    assert error <= tol, f"{what}: max |diff| / max |reference| = {error:.3e} > {tol:.0e} ({dtype})"
    return error


# ------------------------------------------------------------------------------ gradients
# A separate table: gradients are held to two standards, neither of them a forward output's.
#
# - finite_difference: NumPy's hand-written backward against central differences
#   (f(x + h) - f(x - h)) / 2h in float64, h = 1e-6, at a few coordinates per tensor. The
#   quotient is off by ~h^2 f''' / 6 (~1e-12) and by the rounding of f, an ulp or two of
#   |f| over 2h (~1e-9 for |f| ~ 5). Measured per tensor, relative to the tensor's max
#   |grad|: ~1e-9 for single functions and layers' inputs, up to 1e-7 for whole models'
#   small bias gradients. A wrong term or factor is >= 1e-3.
# - finite_difference_floor: an absolute gradient size. A tensor whose gradient is smaller
#   (the key-projection bias: zero in exact arithmetic) is measured against it instead of
#   its own max, since there the difference quotient is only its ~1e-9 rounding noise.
# - loss / parity: every backend's loss_and_grads against NumPy's, float64. The loss to
#   1e-12 relative; each parameter tensor's gradient to 1e-9 of that tensor's max |grad|
#   (measured: 6e-14, torch and JAX alike). Backward passes sum over more terms than forward passes (every
#   position into a weight), hence the wider bound than the forward's 1e-12.
# - parity_floor: plus an absolute floor of 1e-12 times the largest |grad| of the whole
#   model, for tensors whose true gradient is zero: the key-projection bias adds the same
#   q . b_k to every score of a query row, and softmax is shift-invariant, so its gradient
#   is pure rounding (~1e-17) and its relative error is noise, not a bug.
GRADIENT_TOLERANCE = {
    "finite_difference": 1e-6,
    "finite_difference_floor": 1e-2,
    "loss": 1e-12,
    "parity": 1e-9,
    "parity_floor": 1e-12,
}

# Worst gradient error seen per (backend, check) in this run.
GRADIENT_WORST: dict[tuple[str, str], tuple[float, str]] = {}


def _record_gradient(check: str, error: float, what: str, tolerance: float) -> None:
    record_parity(check, "float64", error, tolerance)
    key = (current_backend["name"], check)
    if error > GRADIENT_WORST.get(key, (-1.0, ""))[0]:
        GRADIENT_WORST[key] = (error, f"{current_backend['test']}: {what}")


def assert_matches_finite_differences(analytic, numeric, scale: float, what: str) -> float:
    """``analytic`` and ``numeric``: one tensor's gradient at the same coordinates; ``scale``: the
    tensor's max |analytic gradient|. Returns max |diff| / max(scale, floor)."""
    analytic, numeric = np.asarray(analytic, dtype=np.float64), np.asarray(numeric, dtype=np.float64)
    if not np.all(np.isfinite(analytic)):
        raise AssertionError(f"{what}: non-finite gradient")
    error = float(np.abs(analytic - numeric).max()) / max(scale, GRADIENT_TOLERANCE["finite_difference_floor"])
    _record_gradient("finite differences", error, what, GRADIENT_TOLERANCE["finite_difference"])
    tol = GRADIENT_TOLERANCE["finite_difference"]
    assert error <= tol, f"{what}: max |backward - finite difference| / max(|grad|, floor) = {error:.3e} > {tol:.0e}"
    return error


def assert_loss_and_gradients_match(got: tuple, want: tuple, what: str = "") -> float:
    """``got``, ``want``: (loss, {name: gradient}) from loss_and_grads. Returns the worst gradient error,
    max |diff| / max(the tensor's max |grad|, parity_floor / parity * the model's max |grad|)."""
    (got_loss, got_grads), (want_loss, want_grads) = got, want
    loss_error = abs(got_loss - want_loss) / abs(want_loss)
    _record_gradient("loss", loss_error, what, GRADIENT_TOLERANCE["loss"])
    assert loss_error <= GRADIENT_TOLERANCE["loss"], f"{what}: loss {got_loss!r} vs reference {want_loss!r}"
    assert list(got_grads) == list(want_grads), f"{what}: gradient names differ from the reference's"
    tol, floor = GRADIENT_TOLERANCE["parity"], GRADIENT_TOLERANCE["parity_floor"]
    model_scale = max(float(np.abs(g).max()) for g in want_grads.values())
    worst = 0.0
    for name, want_grad in want_grads.items():
        got_grad = np.asarray(got_grads[name], dtype=np.float64)
        if got_grad.shape != want_grad.shape:
            raise AssertionError(f"{what}: {name} has shape {got_grad.shape}, reference {want_grad.shape}")
        if not np.all(np.isfinite(got_grad)):
            raise AssertionError(f"{what}: {name} has non-finite gradients")
        diff = float(np.abs(got_grad - want_grad).max())
        scale = max(float(np.abs(want_grad).max()), floor / tol * model_scale)
        error = diff / scale
        _record_gradient("gradients", error, f"{what} {name}", tol)
        assert error <= tol, f"{what}: {name}: max |diff| / max(|grad|, floor) = {error:.3e} > {tol:.0e}"
        worst = max(worst, error)
    return worst


# A float64 loss curve's relative difference from the reference's, at every step of a 200-step run
# (the training tests say why their schedules keep the curves that close).
CURVE_TOLERANCE = 1e-8

# Worst relative loss-curve difference per (backend, run), from test_training.py.
CURVE_WORST: dict[tuple[str, str], float] = {}


def record_curve(run: str, error: float, tolerance: float) -> None:
    """Also a "loss curve" check of ``--parity-json`` (float64), for the gradients table of docs/gradients-and-training.md."""
    key = (current_backend["name"], run)
    CURVE_WORST[key] = max(error, CURVE_WORST.get(key, 0.0))
    record_parity("loss curve", "float64", error, tolerance)
