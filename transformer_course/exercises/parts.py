"""The parts handed to a learner: a sub-layer, a norm or a layer to call on NumPy arrays.

Each is NumPy's own module built from the given weights, called exactly as the real module is
called (positional or keyword arguments: ``parts["self_attn"](y, y, y, mask=mask)`` as well as
``(y, y, y, mask)``); an attention or a layer gives its output only, not its attention weights.
Each backend's expected answer rebuilds the whole from the same weights (``params``), or the part
itself in that backend (``build``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_backends.adapters import get_backend
from transformer_spec import Config


class Part:
    def __init__(self, class_name: str, config: Config, params: dict[str, np.ndarray]):
        self.class_name, self.config, self.params = class_name, config, params
        self.module = get_backend("numpy").build(class_name, config, params, "float64")

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        output = self.module(*args, **kwargs)  # whatever the real module accepts, as it accepts it
        return output[0] if isinstance(output, tuple) else output  # (output, attention weights)

    def build(self, b) -> Any:
        """The same part as backend ``b``'s own module, from the same weights."""
        return b.build(self.class_name, self.config, self.params, "float64")

    def __repr__(self) -> str:
        return f"{self.class_name}(d_model={self.config.d_model})"


def weights_under(params: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The weights under ``prefix.``, named as the part itself names them."""
    return {name[len(prefix) + 1 :]: value for name, value in params.items() if name.startswith(prefix + ".")}
