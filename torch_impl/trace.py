"""``trace_model(model, *inputs)``: every named intermediate of one forward pass, in order.

The modules mark their intermediates with ``record(self, name, value)``
(transformer_spec.trace); this file only names the modules -- their paths in the model,
the same as the weights' names -- and runs the forward pass inside a recording.
"""

from __future__ import annotations

import torch

from transformer_spec.trace import Trace, recording

__all__ = ["named_modules", "trace_model"]


def named_modules(model) -> dict[int, str]:
    """id(module) -> its path in ``model`` ("" for the model itself, "encoder.layers.0.self_attn").

    torch lists them itself: ``nn.Module.named_modules``."""
    # differs: framework-module-tree
    return {id(module): path for path, module in model.named_modules()}


def trace_model(model, *inputs, **kwargs) -> Trace:
    """Run ``model(*inputs, **kwargs)`` once -> name -> NumPy array of every intermediate."""
    # differs: framework-autograd
    with recording(named_modules(model)) as recorded, torch.no_grad():
        model(*inputs, **kwargs)
    return recorded
