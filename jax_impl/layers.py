"""The two layers every framework brings and NumPy lacks: a linear layer and dropout.

torch has ``nn.Linear`` and ``F.dropout``, Flax ``nnx.Linear`` and ``nnx.Dropout``;
numpy_impl writes both (and its ``module.py`` the rest of what NumPy lacks: the module base
class and the switch that keeps values for the hand-written backward). Each backend builds
them here under the same names; ``transformer_spec.schema`` says how their layouts map onto
ours, and each backend's ``params.py`` does the mapping.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import Module
from jax import Array


def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nnx.Linear:
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations.

    torch's ``nn.Linear`` stores ``weight`` [out, in], the transpose, and computes
    ``x @ weight.T + bias`` (``params.py`` transposes on the way in and out). Flax's
    ``nnx.Linear`` calls it ``kernel`` and stores it [in, out], our layout, so nothing is
    transposed: ``params.py`` only renames the canonical leaf ``...weight`` to ``kernel``.
    """
    # JAX: a factory returning a plain nnx.Linear that computes exactly x @ weight + bias: dtype
    # and param_dtype put the weights *and* the computation in one dtype (Flax casts the input
    # to dtype, where NumPy would promote float32 weights and a float64 input to float64);
    # zeros, as from_params always overwrites the weights (rngs: a fixed dummy).
    return nnx.Linear(  # differs: framework-layers
        d_in, d_out, use_bias=bias, dtype=dtype, param_dtype=dtype,
        kernel_init=_zeros, bias_init=_zeros, rngs=nnx.Rngs(0),
    )  # fmt: skip


def parameter(shape: tuple[int, ...], dtype: str = "float32", value: float = 0.0) -> nnx.Param:
    """A trained array of ``shape`` in ``dtype``, every entry ``value`` until the weights are
    loaded (``from_params``)."""
    return nnx.Param(_filled(shape, dtype, value))  # (...), shape  # differs: jax-eager-compile


# speed: the placeholders are made by NumPy and copied to the device: jnp.full, Flax's zeros
# initializer and jnp.asarray each compile an XLA program for every new shape (~15 ms each), most
# of what a fresh process spent building a model whose weights from_params then overwrites
# differs: jax-eager-compile
def _filled(shape: tuple[int, ...], dtype, value: float = 0.0) -> Array:
    return jax.device_put(np.full(shape, value, dtype=jnp.dtype(dtype)))  # (...), shape


# differs: jax-eager-compile
def _zeros(key, shape: tuple[int, ...], dtype) -> Array:  # Flax's initializer signature
    return _filled(shape, dtype)  # (...), shape


class Dropout(Module):
    """In training mode, zero each element with probability ``rate`` and scale the rest by
    1 / (1 - rate), so that the expected value is unchanged and inference needs no
    rescaling ("inverted dropout"); in inference mode (``model.eval()``): the identity.

    The masks: NumPy draws them from ``self.rng``, a Generator, and JAX from ``self.rngs``,
    an ``nnx.RngStream`` (a key and a counter that advances on each call); ``seed_dropout``
    gives every Dropout of a model its own, all derived from one seed. torch's ``F.dropout``
    draws from torch's one global generator, which ``seed_dropout`` seeds.
    """

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate
        # JAX: NNX's model.train() and model.eval() set deterministic on every module that has
        # it (as on nnx.Dropout); False, training mode, as a new nnx.Dropout
        self.deterministic = False  # differs: framework-layers
        self.rngs = nnx.Rngs(dropout=0).dropout  # replaced by seed_dropout

    def __call__(self, x: Array) -> Array:
        if self.deterministic or self.rate == 0:
            return x
        # JAX: the stream's counter is state that NNX must carry out of a compiled function:
        # nnx.jit does; under plain jax.jit the update is lost and every call would draw the same
        # mask (the model's __call__ switches to nnx.jit while dropout is active for that reason)
        keep = jax.random.bernoulli(self.rngs(), 1.0 - self.rate, x.shape)  # (...,) like x
        return jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)  # (...,) like x


def seed_dropout(model: Module, seed: int) -> None:
    """Make the next dropout masks reproducible: the same seed gives the same masks, and no
    two layers share a mask. NumPy and JAX give every Dropout in ``model`` its own generator
    (random stream), all spawned (forked) from ``seed``; torch seeds its one global generator,
    from which it draws them all."""
    root = nnx.Rngs(dropout=seed).dropout
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Dropout):
            module.rngs = root.fork()


# differs: jax-jit
def dropout_active(model: Module) -> bool:
    """Whether a call of ``model`` draws dropout masks (and so changes its random state)."""
    return any(
        isinstance(module, Dropout) and not module.deterministic and module.rate > 0
        for _, module in nnx.iter_graph(model)
    )
