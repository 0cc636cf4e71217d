"""Speed, in one place: the fused kernels JAX runs instead of the written-out math.

The component files show the math; a teaching function or forward with a faster equivalent
carries one marked line, ``@fusable(name)``, and the kernel registered here under that name
runs instead while fused kernels are enabled (``transformer_spec.kernels`` has the switch and
how a call is dispatched). ``shared_tests/components/test_fast_paths.py`` holds every kernel
equal to the code it replaces.

JAX's kernels: none. Under ``jax.jit`` (how the model runs; see ``model.py``) XLA fuses the
written-out math itself: LayerNorm's passes, GELU's, the softmax's masking, scaling and
normalising each become one loop over the data, and the matmuls go to the same Eigen/oneDNN
GEMMs a kernel would call. The fused attention JAX offers, ``jax.nn.dot_product_attention``,
computes its softmax in float32 even for float64 inputs (and averages v over a query row with
no allowed key, where we define 0): registering it would break the float64 parity the suite
holds JAX to. The ``@fusable`` lines stay, so that the three backends read alike
and a kernel added here is reached without touching the teaching code. (The switch is read
when a function is traced: a jit-compiled function keeps the path it was compiled with.)
"""

from __future__ import annotations

from collections.abc import Callable

from transformer_spec.kernels import (
    fusable_in,
    fused_kernels,
    fused_kernels_enabled,
    use_fused_kernels,
)

__all__ = ["KERNELS", "fusable", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

KERNELS: dict[str, Callable] = {}  # name -> kernel: none in JAX (see above)
fusable = fusable_in(KERNELS)  # the decorator of the marked lines: @fusable("gelu")
