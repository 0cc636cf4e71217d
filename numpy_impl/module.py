"""What ``nn.Module`` and ``torch.autograd`` (or ``nnx.Module`` and ``jax.grad``) give the other
backends, cut down to what the NumPy modules need. NumPy's own file: the other backends
import these from their framework, so it has no counterpart there (the mirror report lists
it under ``numpy-framework``).

NumPy has no autograd, so every module also has a hand-written backward pass (llm.c
style), in the same class, right after its forward:

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
    """Whether forward passes keep values for ``backward`` now (off by default: inference
    keeps nothing)."""
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
            if hasattr(module, "training"):  # a Dropout
                module.training = mode
        return self

    def eval(self):
        """Inference mode: every Dropout is the identity."""
        return self.train(False)


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
