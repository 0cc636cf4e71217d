"""Speed, in one place: the fused kernels JAX runs instead of the written-out math.

The component files show the math as the paper writes it. A teaching function or forward
that has a faster equivalent carries one marked line, ``@fusable("gelu")``; while fused
kernels are enabled (the default; ``use_fused_kernels(False)`` or ``with
fused_kernels(False):`` switches them off) and no trace is recording, the call goes to the
kernel registered here under that name. A kernel returns ``NotImplemented`` when it does
not apply to a call (weights requested, gradients being kept, float64 where it would cost
exactness), and the written-out code runs. ``shared_tests/test_fast_paths.py`` holds every
kernel equal to the code it replaces.

JAX's kernels: none. Under ``jax.jit`` (how the model runs; see ``model.py``) XLA fuses the
written-out math itself: LayerNorm's passes, GELU's, the softmax's masking, scaling and
normalising each become one loop over the data, and the matmuls go to the same Eigen/oneDNN
GEMMs a kernel would call. The fused attention JAX offers, ``jax.nn.dot_product_attention``,
computes its softmax in float32 even for float64 inputs (and averages v over a query row with
no allowed key, where we define 0): registering it would break the float64 parity the suite
holds JAX to (PITFALLS.md). The ``@fusable`` lines stay, so that the three backends read alike
and a kernel added here is reached without touching the teaching code. (The switch is read
when a function is traced: a jit-compiled function keeps the path it was compiled with.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from transformer_spec.trace import is_recording

__all__ = ["KERNELS", "fusable", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

KERNELS: dict[str, Callable] = {}  # name -> kernel: none in JAX (see above)
_enabled = [True]  # process-wide, as torch's and JAX's global switches


def use_fused_kernels(enabled: bool) -> None:
    """Switch every fused kernel on (the default) or off (the written-out math everywhere)."""
    _enabled[0] = bool(enabled)


def fused_kernels_enabled() -> bool:
    return _enabled[0]


@contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """``use_fused_kernels(enabled)`` inside the block, the previous setting after it."""
    previous = _enabled[0]
    use_fused_kernels(enabled)
    try:
        yield
    finally:
        _enabled[0] = previous


def fusable(name: str) -> Callable[[Callable], Callable]:
    """Marks a teaching function (or a module's forward) that the kernel ``KERNELS[name]`` may
    replace: the kernel gets the same arguments and returns the same result, or NotImplemented."""

    def decorate(teaching: Callable) -> Callable:
        @functools.wraps(teaching)
        def dispatch(*args, **kwargs):
            kernel = KERNELS.get(name)
            if kernel is not None and _enabled[0] and not is_recording():
                result = kernel(*args, **kwargs)
                if result is not NotImplemented:
                    return result
            return teaching(*args, **kwargs)

        return dispatch

    return decorate
