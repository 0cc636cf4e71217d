"""Canonical weight dicts <-> modules. The canonical names are the modules' attribute paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec import Config, init_params, load_params, param_schema, parent_of
from transformer_spec.io import check_weights_to_load

from .model import MODEL_CLASSES


def from_params(
    module_class: type,
    config: Config,
    params: Mapping[str, Any],
    dtype: str | None = None,
    *,
    allow_non_finite: bool = False,
) -> Any:
    """Build ``module_class(config)`` and load the canonical ``params`` into it, in inference mode
    (dropout off, as loaded weights are used; ``module.train()`` switches it on); ``WeightsError``
    when they do not fit it or hold NaN or inf (unless ``allow_non_finite``)."""
    schema, dtype = check_weights_to_load(module_class, config, params, dtype, allow_non_finite)
    module = module_class(config, dtype)
    for name in schema:
        parent, leaf = parent_of(module, name)
        # a copy: the module owns its weights
        setattr(parent, leaf, np.array(params[name], dtype=dtype))
    module.eval()  # (torch's eval returns the module, NNX's returns None)
    return module


def to_params(module: Any) -> dict[str, np.ndarray]:
    """The module's weights under their canonical names, as NumPy arrays."""
    params = {}
    for name in param_schema(module.config, module.schema):
        parent, leaf = parent_of(module, name)
        params[name] = np.array(getattr(parent, leaf))
    return params


def build_model(
    config: Config,
    params: Mapping[str, Any] | None = None,
    dtype: str | None = None,
    *,
    allow_non_finite: bool = False,
) -> Any:
    """The model class that ``config.kind`` names, loaded with ``params``, in inference mode
    (dropout off, as a pretrained model loads; ``model.train()`` switches it on). ``params``
    None: the seeded initialisation every backend shares (``init_params(config, seed=0)``),
    in ``dtype`` (float32 by default): the same numbers in NumPy, JAX and torch."""
    if params is None:
        params = init_params(config, seed=0, dtype=dtype or "float32")
    model = from_params(
        MODEL_CLASSES[config.kind], config, params, dtype, allow_non_finite=allow_non_finite
    )
    model.eval()  # (torch's eval returns the model, NNX's returns None)
    return model


def load_model(path: str, dtype: str | None = None, *, allow_non_finite: bool = False) -> Any:
    """A model from a safetensors file written by ``transformer_spec.save_params``."""
    params, config = load_params(path, allow_non_finite=allow_non_finite)
    return build_model(config, params, dtype, allow_non_finite=allow_non_finite)
