"""What NumPy lacks and the other frameworks bring: a module base class, a linear layer, dropout.

(PyTorch has ``nn.Module``/``nn.Linear`` and Flax ``nnx.Module``/``nnx.Linear``; see
``transformer_spec.schema`` for how their layouts map onto ours.)

NumPy has no autograd, so every module here also has a hand-written backward pass
(llm.c style), in the same class, right after its forward:

* ``__call__(...)`` is the forward pass, the same text as torch's ``forward``. Inside
  ``with enable_grad():`` it also keeps, by name, what its backward needs:
  ``self.keep(x_hat=x_hat, std=std)``; outside (inference, the default) it keeps nothing.
  (torch's autograd, too, records only while gradients are enabled.)
* ``backward(grad_output)`` reads those names from ``self.saved`` and returns
  ``(grad_input, grads)``: the gradient of a scalar loss with respect to the float
  input(s), and ``grads``, a dict from parameter names relative to the module
  (``"w_q.weight"``) to gradients, named exactly as in ``transformer_spec.param_schema``.
  Gradients with respect to integer ids are None.

A module keeps the values of its *last* forward call: ``backward`` follows the forward it
belongs to (no module is called twice in one forward pass of these models).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

_grad = threading.local()  # per thread, as torch's grad mode


@contextmanager
def enable_grad() -> Iterator[None]:
    """Inside: every module's forward keeps what its backward needs (``Module.keep``)."""
    previous = is_grad_enabled()
    _grad.enabled = True
    try:
        yield
    finally:
        _grad.enabled = previous


def is_grad_enabled() -> bool:
    """Whether forward passes keep values for ``backward`` now (off by default: inference keeps nothing)."""
    return getattr(_grad, "enabled", False)


def with_prefix(prefix: str, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{"weight": g} -> {"w_q.weight": g}: a submodule's gradients under its name in the parent."""
    return {f"{prefix}.{name}": grad for name, grad in grads.items()}


class Module:
    """What ``nn.Module`` and ``nnx.Module`` give the other backends' modules, cut down to what
    NumPy modules need: the training/inference switch (for dropout), and a place to keep,
    by name, what the hand-written backward needs."""

    saved: SimpleNamespace | None = None  # what the last forward kept for ``backward``, by name

    def keep(self, **values: np.ndarray | None) -> None:
        """Keep ``values`` (by name) for ``backward``, only while gradients are enabled; in
        inference, drop whatever an earlier forward kept."""
        self.saved = SimpleNamespace(**values) if is_grad_enabled() else None

    def train(self, mode: bool = True):
        """Training mode (dropout on), or inference mode with ``mode=False``; returns self."""
        for _, module in named_submodules(self):
            if isinstance(module, Dropout):
                module.training = mode
        return self

    def eval(self):
        """Inference mode: every Dropout is the identity."""
        return self.train(False)


class Linear(Module):
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype: str = "float32"):
        self.weight = np.zeros((d_in, d_out), dtype)  # (d_in, d_out)
        self.bias = np.zeros((d_out,), dtype) if bias else None  # (d_out,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # All positions as the rows of one matrix: NumPy runs (B, T, d_in) @ W as B separate
        # BLAS calls, (B T, d_in) @ W as one big one (1.1-1.3x faster at BERT-base sizes).
        rows = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        y = (rows @ self.weight).reshape(*x.shape[:-1], self.weight.shape[1])  # (N, d_in) @ (d_in, d_out)
        if self.bias is not None:
            y += self.bias  # (..., d_out), in place: y is a new array, so no second one
        self.keep(x=x)  # (..., d_in): the only value the backward needs
        return y

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (..., d_out) -> grad_x (..., d_in), {"weight": (d_in, d_out), "bias": (d_out,)}."""
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


class Dropout(Module):
    """In training mode, zero each element with probability ``rate`` and scale the rest by
    1 / (1 - rate), so that the expected value is unchanged and inference needs no
    rescaling ("inverted dropout", as torch and Flax do). In inference mode: the identity.

    The mask is drawn from ``self.rng``; ``seed_dropout`` gives every Dropout of a model
    its own generator, all derived from one seed.
    """

    def __init__(self, rate: float):
        self.rate = rate
        self.training = True  # as a new torch nn.Module or nnx.Dropout: switch with model.eval()
        self.rng = np.random.default_rng(0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.training or self.rate == 0:
            self.keep(multiplier=None)  # nothing dropped
            return x
        keep = self.rng.random(x.shape) >= self.rate  # (...,) like x: True with probability 1 - rate
        multiplier = keep.astype(x.dtype) / (1.0 - self.rate)  # (...,) like x: 0 or 1 / (1 - rate)
        self.keep(multiplier=multiplier)
        return x * multiplier  # (...,) like x

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, dict]:
        """The same multiplier: dropped elements pass no gradient, kept ones 1 / (1 - rate) of it."""
        multiplier = self.saved.multiplier  # (...,) like x, or None
        return (grad_output if multiplier is None else grad_output * multiplier), {}  # (...,) like x


def seed_dropout(model, seed: int) -> None:
    """Give every Dropout in ``model`` its own generator, all spawned from ``seed``: the same
    seed gives the same masks, and no two layers share a mask."""
    dropouts = [module for _, module in named_submodules(model) if isinstance(module, Dropout)]
    for module, rng in zip(dropouts, np.random.default_rng(seed).spawn(len(dropouts)), strict=True):
        module.rng = rng


def named_submodules(module) -> list[tuple[str, object]]:
    """(path, module) for ``module`` ("") and everything under it ("encoder.layers.0.self_attn"),
    each once, in attribute order: what torch's ``named_modules`` and NNX's ``iter_graph``
    give the other backends. NumPy modules are plain objects: walk their attributes (and
    lists of layers)."""
    found, seen = [], set()

    def visit(obj, path: str) -> None:
        if isinstance(obj, list):
            for i, item in enumerate(obj):
                visit(item, f"{path}.{i}" if path else str(i))
        elif type(obj).__module__.startswith(__package__) and id(obj) not in seen:
            seen.add(id(obj))
            found.append((path, obj))
            for attr, child in vars(obj).items():
                visit(child, f"{path}.{attr}" if path else attr)

    visit(module, "")
    return found
