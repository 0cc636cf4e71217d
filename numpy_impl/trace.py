"""``trace_model(model, *inputs)``: every named intermediate of one forward pass, in order.

The modules mark their intermediates with ``record(self, name, value)``
(transformer_spec.trace); this file only names the modules -- their paths in the model,
the same as the weights' names -- and runs the forward pass inside a recording.
"""

from __future__ import annotations

from transformer_spec.trace import Trace, recording

from .module import named_submodules

__all__ = ["named_modules", "trace_model"]


def named_modules(model) -> dict[int, str]:
    """id(module) -> its path in ``model`` ("" for the model itself, "encoder.layers.0.self_attn").
    """
    return {id(module): path for path, module in named_submodules(model)}


def trace_model(model, *inputs, **kwargs) -> Trace:
    """Run ``model(*inputs, **kwargs)`` once -> name -> NumPy array of every intermediate."""
    with recording(named_modules(model)) as recorded:
        model(*inputs, **kwargs)
    return recorded
