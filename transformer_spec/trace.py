"""Named intermediates: what ``transformer-ref trace`` prints and the docs' walkthrough shows.

Every backend's modules mark their intermediates with one line each,
``record(self, scores=scores)``. Outside a recording that call returns at once (and
inside ``jax.jit`` it is a Python no-op at trace time), so the model code pays nothing.
Inside ``with recording(names) as trace:`` each call stores a NumPy copy of the value
under its full name, the module's path in the model plus the local name:
``encoder.layers.0.self_attn.scores``. The paths are the same as the weights' names in
``transformer_spec.param_schema``, so the two read alike. A free function called by a
module (``scaled_dot_product_attention`` by ``MultiHeadAttention``) records with
``module=None``: its values go under the path of the module that recorded last.

``names`` maps ``id(module) -> path``; each backend's ``trace.py`` builds it from its own
module tree (``nn.Module.named_modules``, ``nnx.iter_graph``, attributes in NumPy).

A module called twice in one recording (none is, in one forward pass) gets ``#2``,
``#3`` ... after its later names, so nothing is overwritten silently.

A recording belongs to the thread that opened it: ``record`` in another thread (the same model
serving requests, JAX tracing a function for ``jit``) neither writes into it nor sees it, and
``is_recording()`` is False there, so torch's fused kernels keep running in the other threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np

__all__ = ["Trace", "is_recording", "record", "recording"]


class Trace(dict):
    """name -> np.ndarray, in the order the forward pass produced them."""


# Per thread: the recordings in progress in this thread, innermost last (``active``, a list of
# (names, trace, last path)); absent until the thread opens one.
_local = threading.local()


def record(module: object | None, **values) -> None:
    """Store each value as ``<path of module>.<name>`` if a recording is in progress:
    ``record(self, q=q, k=k, v=v)``, in the order given.

    ``module=None``: under the path of the module that recorded last."""
    active = getattr(_local, "active", None)
    if not active:
        return
    names, trace, last_path = active[-1]
    for name, value in values.items():
        _store(names, trace, last_path, module, name, value)


def _store(names: Mapping[int, str], trace: Trace, last_path: list, module: object | None, name: str, value) -> None:
    if "Tracer" in type(value).__name__:  # inside jax.jit: no values yet, and the modules are copies
        raise TypeError(
            f"trace: {name} has no concrete value ({type(value).__name__}); record eagerly "
            "(in JAX, the model itself, not ``compiled(model)``)"
        )
    if module is None:
        if not last_path:
            raise KeyError(f"record(None, {name}=...): no module has recorded yet to attribute it to")
        path = last_path[0]
    else:
        path = names.get(id(module))
        if path is None:
            raise KeyError(
                f"record({type(module).__name__}, {name}=...): this module is not part of the model being traced"
            )
        last_path[:] = [path]
    key = f"{path}.{name}" if path else name
    if key in trace:
        n = 2
        while f"{key}#{n}" in trace:
            n += 1
        key = f"{key}#{n}"
    trace[key] = _to_numpy(value)


def is_recording() -> bool:
    """Whether a recording is in progress in this thread: a fast path that skips named
    intermediates (torch's fused attention has no scores or weights to record) steps aside
    while one is, in this thread only."""
    return bool(getattr(_local, "active", None))


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor: leave the autograd graph and the device
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: recorded in float32, exactly
            value = value.float()
        value = value.numpy()
    return np.array(value)  # a copy: later in-place updates must not change the record


@contextmanager
def recording(names: Mapping[int, str]) -> Iterator[Trace]:
    """Record every ``record(module, ...)`` call of the modules in ``names`` (id -> path) made in
    this thread while the block runs."""
    trace = Trace()
    if not hasattr(_local, "active"):
        _local.active = []
    _local.active.append((names, trace, []))
    try:
        yield trace
    finally:
        _local.active.pop()
