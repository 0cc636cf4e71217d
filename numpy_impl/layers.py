"""The two layers every framework brings and NumPy lacks: a linear layer and dropout.

torch has ``nn.Linear`` and ``F.dropout``, Flax ``nnx.Linear`` and ``nnx.Dropout``;
numpy_impl writes both (and its ``module.py`` the rest of what NumPy lacks: the module base
class and the switch that keeps values for the hand-written backward). Each backend builds
them here under the same names; ``transformer_spec.schema`` says how their layouts map onto
ours, and each backend's ``params.py`` does the mapping.
"""

from __future__ import annotations

import numpy as np
from numpy import ndarray as Array

from .module import Module, named_submodules


class Linear(Module):
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations.

    torch's ``nn.Linear`` stores ``weight`` [out, in], the transpose, and computes
    ``x @ weight.T + bias`` (``params.py`` transposes on the way in and out). Flax's
    ``nnx.Linear`` calls it ``kernel`` and stores it [in, out], our layout, so nothing is
    transposed: ``params.py`` only renames the canonical leaf ``...weight`` to ``kernel``.
    """

    # differs: framework-layers
    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype: str = "float32"):
        self.weight = np.zeros((d_in, d_out), dtype)  # (d_in, d_out)
        self.bias = np.zeros((d_out,), dtype) if bias else None  # (d_out,)

    def __call__(self, x: Array) -> Array:  # differs: framework-layers
        # All positions as the rows of one matrix: NumPy runs (B, T, d_in) @ W as B separate
        # BLAS calls, (B T, d_in) @ W as one big one (1.1-1.3x faster at BERT-base sizes).
        rows = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        # (N, d_in) @ (d_in, d_out), then (..., d_out)
        y = (rows @ self.weight).reshape(*x.shape[:-1], self.weight.shape[1])
        if self.bias is not None:
            y += self.bias  # (..., d_out), in place: y is a new array, so no second one
        self.keep(x=x)  # (..., d_in): the only value the backward needs
        return y

    def backward(self, grad_output: Array) -> tuple[Array, dict[str, Array]]:
        """grad_output (..., d_out) -> grad_x (..., d_in), {"weight": (d_in, d_out),
        "bias": (d_out,)}."""
        x = self.saved.x  # (..., d_in)
        # y = x W: dx = dy W^T
        grad_x = grad_output @ self.weight.T  # (..., d_out) @ (d_out, d_in) -> (..., d_in)
        # every position used the same W: its gradient sums x^T dy over all of them
        rows_x = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (N, d_out)
        grads = {"weight": rows_x.T @ rows_grad}  # (d_in, N) @ (N, d_out) -> (d_in, d_out)
        if self.bias is not None:
            grads["bias"] = rows_grad.sum(axis=0)  # (d_out,), added at every position
        return grad_x, grads


def parameter(shape: tuple[int, ...], dtype: str = "float32", value: float = 0.0) -> Array:
    """A trained array of ``shape`` in ``dtype``, every entry ``value`` until the weights are
    loaded (``from_params``)."""
    return np.full(shape, value, dtype=dtype)  # (...), shape


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
        # differs: framework-layers
        self.training = True  # as a new torch nn.Module or nnx.Dropout: switch with model.eval()
        self.rng = np.random.default_rng(0)

    def __call__(self, x: Array) -> Array:
        if not self.training or self.rate == 0:
            # differs: numpy-autograd
            self.keep(multiplier=None)  # nothing dropped
            return x
        # differs: framework-layers
        keep = self.rng.random(x.shape) >= self.rate  # (...,) like x: True w.p. 1 - rate
        multiplier = keep.astype(x.dtype) / (1.0 - self.rate)  # (...,) like x: 0 or 1 / (1 - rate)
        self.keep(multiplier=multiplier)
        return x * multiplier  # (...,) like x

    def backward(self, grad_output: Array) -> tuple[Array, dict]:
        """The same multiplier: dropped elements pass no gradient, kept ones 1 / (1 - rate) of
        it."""
        multiplier = self.saved.multiplier  # (...,) like x, or None
        # (...,) like x
        return (grad_output if multiplier is None else grad_output * multiplier), {}


def seed_dropout(model: Module, seed: int) -> None:
    """Make the next dropout masks reproducible: the same seed gives the same masks, and no
    two layers share a mask. NumPy and JAX give every Dropout in ``model`` its own generator
    (random stream), all spawned (forked) from ``seed``; torch seeds its one global generator,
    from which it draws them all."""
    # differs: dropout-streams
    dropouts = [module for _, module in named_submodules(model) if isinstance(module, Dropout)]
    for module, rng in zip(dropouts, np.random.default_rng(seed).spawn(len(dropouts)), strict=True):
        module.rng = rng
