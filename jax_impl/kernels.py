"""Speed, in one place: the fused kernels JAX runs instead of the written-out math.

The component files show the math as the paper writes it. A teaching function or forward
that has a faster equivalent carries one marked line, ``@fusable("gelu")``; while fused
kernels are enabled (the default; ``use_fused_kernels(False)`` or ``with
fused_kernels(False):`` switches them off, in every backend at once: the switch is
``transformer_spec.kernels``) and no trace is recording, the call goes to the
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

from collections.abc import Callable

from transformer_spec.kernels import fusable_in, fused_kernels, fused_kernels_enabled, use_fused_kernels

__all__ = ["KERNELS", "fusable", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

KERNELS: dict[str, Callable] = {}  # name -> kernel: none in JAX (see above)
fusable = fusable_in(KERNELS)  # the decorator of the marked lines: @fusable("gelu")
