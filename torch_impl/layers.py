"""The two layers every framework brings and NumPy lacks: a linear layer and dropout.

torch has ``nn.Linear`` and ``F.dropout``, Flax ``nnx.Linear`` and ``nnx.Dropout``;
numpy_impl writes both (and its ``module.py`` the rest of what NumPy lacks: the module base
class and the switch that keeps values for the hand-written backward). Each backend builds
them here under the same names; ``transformer_spec.schema`` says how their layouts map onto
ours, and each backend's ``params.py`` does the mapping.
"""

from __future__ import annotations

import torch
from torch import Tensor as Array
from torch import nn
from torch.nn import Module
from torch.nn import functional as F


# differs: framework-layers
def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nn.Linear:
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations.

    torch's ``nn.Linear`` stores ``weight`` [out, in], the transpose, and computes
    ``x @ weight.T + bias`` (``params.py`` transposes on the way in and out). Flax's
    ``nnx.Linear`` calls it ``kernel`` and stores it [in, out], our layout, so nothing is
    transposed: ``params.py`` only renames the canonical leaf ``...weight`` to ``kernel``.
    """
    return nn.Linear(d_in, d_out, bias=bias, dtype=_torch_dtype(dtype))


def parameter(shape: tuple[int, ...], dtype: str = "float32", value: float = 0.0) -> nn.Parameter:
    """A trained array of ``shape`` in ``dtype``, every entry ``value`` until the weights are
    loaded (``from_params``)."""
    return nn.Parameter(torch.full(shape, value, dtype=_torch_dtype(dtype)))  # (...), shape


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:  # differs: framework-layers
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))


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

    def forward(self, x: Array) -> Array:
        # differs: framework-layers
        if not self.training or self.rate == 0:
            return x
        # differs: framework-layers
        return F.dropout(x, self.rate)  # (...,) like x


def seed_dropout(model: Module, seed: int) -> None:
    """Make the next dropout masks reproducible: the same seed gives the same masks, and no
    two layers share a mask. NumPy and JAX give every Dropout in ``model`` its own generator
    (random stream), all spawned (forked) from ``seed``; torch seeds its one global generator,
    from which it draws them all."""
    # differs: dropout-streams
    torch.manual_seed(seed)
