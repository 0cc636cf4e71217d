"""The linear layer: Flax's ``nnx.Linear``, set up to compute exactly ``x @ weight + bias``.

(NumPy lacks a linear layer and numpy_impl writes its own; PyTorch has ``nn.Linear``.
See ``transformer_spec.schema`` for how their layouts map onto ours.)

Flax stores the matrix as ``kernel`` with shape [in, out] -- the same layout as our
canonical ``weight`` (torch's ``weight`` is [out, in]) -- so nothing is transposed:
``params.py`` only renames the canonical leaf ``...weight`` of a Linear to ``kernel``.
"""

from __future__ import annotations

import jax
from flax import nnx


def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nnx.Linear:
    """``x @ weight + bias`` with ``weight`` (Flax: ``kernel``) stored [in, out], as in the paper's equations.

    A factory, not a class: it returns a plain ``nnx.Linear``. Differences from a bare
    ``nnx.Linear(d_in, d_out, rngs=...)``, all deliberate:

    * ``precision=HIGHEST``: on GPU/TPU a float32 matmul may otherwise run as TF32 or
      bf16 passes (about 3 significant digits), far from the NumPy reference.
    * ``dtype``/``param_dtype``: the weights *and* the computation in one dtype. Flax
      casts the input to ``dtype`` (NumPy would instead promote float32 weights and a
      float64 input to float64).
    * ``kernel_init=zeros``: the weights are always overwritten by ``from_params``; the
      ``rngs`` Flax insists on are a fixed dummy.
    """
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        dtype=dtype,
        param_dtype=dtype,
        precision=jax.lax.Precision.HIGHEST,
        kernel_init=nnx.initializers.zeros,
        rngs=nnx.Rngs(0),
    )
