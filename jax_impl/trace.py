"""``trace_model(model, *inputs)``: every named intermediate of one forward pass, in order.

The modules mark their intermediates with ``record(self, name, value)``
(transformer_spec.trace); this file only names the modules -- their paths in the model,
the same as the weights' names -- and runs the forward pass inside a recording.
"""

from __future__ import annotations

from flax import nnx

from transformer_spec.trace import Trace, recording

__all__ = ["named_modules", "trace_model"]


def named_modules(model) -> dict[int, str]:
    """id(module) -> its path in ``model`` ("" for the model itself, "encoder.layers.0.self_attn").

    NNX walks its own graph: ``nnx.iter_graph`` yields (path, node) for every node."""
    return {
        id(node): ".".join(str(part) for part in path)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Module)
    }


def trace_model(model, *inputs, **kwargs) -> Trace:
    """Run ``model(*inputs, **kwargs)`` once, eagerly -> name -> NumPy array of every intermediate.

    The model itself, not ``compiled(model)``: under ``jax.jit`` the intermediates are
    tracers, with no values to record until the whole compiled program has run."""
    with recording(named_modules(model)) as recorded:
        model(*inputs, **kwargs)
    return recorded
