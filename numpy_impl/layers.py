"""The two building blocks NumPy lacks: a linear layer and an embedding table.

(PyTorch has ``nn.Linear``/``nn.Embedding`` and Flax ``nnx.Linear``; see
``transformer_spec.schema`` for how their layouts map onto ours.)

NumPy has no autograd, so every module here also has a hand-written backward pass
(llm.c style), next to its forward:

* ``forward_for_backward(...)`` returns ``(what __call__ returns, saved)``: the same
  computation (``__call__`` calls it and drops ``saved``), plus the intermediate arrays
  the backward pass needs.
* ``backward(saved, grad_output)`` returns ``(grad_inputs, grads)``: the gradient of a
  scalar loss with respect to the float inputs, and ``grads``, a dict from parameter
  names relative to the module (``"w_q.weight"``) to gradients, named exactly as in
  ``transformer_spec.param_schema``. Gradients with respect to integer ids are None.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def with_prefix(prefix: str, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{"weight": g} -> {"w_q.weight": g}: a submodule's gradients under its name in the parent."""
    return {f"{prefix}.{name}": grad for name, grad in grads.items()}


class Linear:
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the paper's equations."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, dtype: str = "float32"):
        self.weight = np.zeros((d_in, d_out), dtype)
        self.bias = np.zeros((d_out,), dtype) if bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward_for_backward(x)[0]

    def forward_for_backward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # All positions as the rows of one matrix: NumPy runs (B, T, d_in) @ W as B separate
        # BLAS calls, (B T, d_in) @ W as one big one (1.1-1.3x faster at BERT-base sizes).
        rows = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        y = (rows @ self.weight).reshape(*x.shape[:-1], self.weight.shape[1])  # (N, d_in) @ (d_in, d_out)
        if self.bias is not None:
            y += self.bias  # in place: y is a new array, so no second (..., d_out) one
        return y, x  # the backward needs only the input

    def backward(self, saved: np.ndarray, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (..., d_out) -> grad_x (..., d_in), {"weight": (d_in, d_out), "bias": (d_out,)}."""
        x = saved  # (..., d_in)
        # y = x W: dx = dy W^T
        grad_x = grad_output @ self.weight.T  # (..., d_out) @ (d_out, d_in) -> (..., d_in)
        # every position used the same W: its gradient sums x^T dy over all of them
        rows_x = x.reshape(-1, x.shape[-1])  # (N, d_in), N = the product of the leading dims
        rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (N, d_out)
        grads = {"weight": rows_x.T @ rows_grad}  # (d_in, N) @ (N, d_out) -> (d_in, d_out)
        if self.bias is not None:
            grads["bias"] = rows_grad.sum(axis=0)  # (d_out,), added at every position
        return grad_x, grads


class Dropout:
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
        return self.forward_for_backward(x)[0]

    def forward_for_backward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (x with dropped elements 0 and the rest scaled, the multiplier used: None when
        nothing is dropped, else 0 or 1 / (1 - rate) per element)."""
        if not self.training or self.rate == 0:
            return x, None
        keep = self.rng.random(x.shape) >= self.rate  # True with probability 1 - rate
        multiplier = keep.astype(x.dtype) / (1.0 - self.rate)  # (..., ) like x
        return x * multiplier, multiplier

    def backward(self, saved: np.ndarray | None, grad_output: np.ndarray) -> tuple[np.ndarray, dict]:
        """The same multiplier: dropped elements pass no gradient, kept ones 1 / (1 - rate) of it."""
        return (grad_output if saved is None else grad_output * saved), {}


class Module:
    """What ``nn.Module`` and ``nnx.Module`` give the other backends' modules, cut down to the
    one thing NumPy modules need: the training/inference switch (for dropout)."""

    def train(self, mode: bool = True):
        """Training mode (dropout on), or inference mode with ``mode=False``; returns self."""
        for _, module in named_submodules(self):
            if isinstance(module, Dropout):
                module.training = mode
        return self

    def eval(self):
        """Inference mode: every Dropout is the identity."""
        return self.train(False)


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
