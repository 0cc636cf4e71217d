"""The linear layer: Flax's ``nnx.Linear``, set up to compute exactly ``x @ weight + bias``.

(NumPy lacks a linear layer and numpy_impl writes its own; PyTorch has ``nn.Linear``.
See ``transformer_spec.schema`` for how their layouts map onto ours.)

Flax stores the matrix as ``kernel`` with shape [in, out] -- the same layout as our
canonical ``weight`` (torch's ``weight`` is [out, in]) -- so nothing is transposed:
``params.py`` only renames the canonical leaf ``...weight`` of a Linear to ``kernel``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array


def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nnx.Linear:
    """``x @ weight + bias`` with ``weight`` (Flax: ``kernel``) stored [in, out], as in the paper's equations.

    A factory, not a class: it returns a plain ``nnx.Linear``. Differences from a bare
    ``nnx.Linear(d_in, d_out, rngs=...)``, all deliberate:

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
        kernel_init=nnx.initializers.zeros,
        rngs=nnx.Rngs(0),
    )


class Dropout(nnx.Module):
    """In training mode, zero each element with probability ``rate`` and scale the rest by
    1 / (1 - rate) ("inverted dropout"); in inference mode: the identity.

    NNX's ``model.train()`` and ``model.eval()`` set ``deterministic`` on every module that
    has it (as on ``nnx.Dropout``). The mask comes from ``self.rngs``, an ``nnx.RngStream``:
    a key and a counter that advances on each call. The counter is state that NNX must
    carry out of a compiled function: under ``nnx.jit`` it does; under plain ``jax.jit``
    the update is lost and every call would draw the same mask (the model's ``__call__``
    switches to ``nnx.jit`` while dropout is active for that reason).
    ``seed_dropout`` gives every Dropout of a model its own stream, forked from one seed.
    """

    def __init__(self, rate: float):
        self.rate = rate
        # differs: framework-layers
        self.deterministic = False  # as a new nnx.Dropout: training mode
        self.rngs = nnx.Rngs(dropout=0).dropout  # replaced by seed_dropout

    def __call__(self, x: Array) -> Array:
        if self.deterministic or self.rate == 0:
            return x
        keep = jax.random.bernoulli(self.rngs(), 1.0 - self.rate, x.shape)  # (...,) like x: True w.p. 1 - rate
        return jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)  # (...,) like x


def seed_dropout(model: nnx.Module, seed: int) -> None:
    """Give every Dropout in ``model`` its own random stream, all forked from ``seed``: the
    same seed gives the same masks, and no two layers share a mask."""
    root = nnx.Rngs(dropout=seed).dropout
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Dropout):
            module.rngs = root.fork()


def dropout_active(model: nnx.Module) -> bool:  # differs: jax-jit
    """Whether a call of ``model`` draws dropout masks (and so changes its random state)."""
    return any(
        isinstance(module, Dropout) and not module.deterministic and module.rate > 0
        for _, module in nnx.iter_graph(model)
    )
