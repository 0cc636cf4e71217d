"""Canonical weight dicts <-> modules. The canonical names are the modules' attribute paths.

One exception, Flax's: an ``nnx.Linear`` calls its matrix ``kernel``, not ``weight``.
It is stored [in, out] like ours, so the canonical ``...w_1.weight`` is simply read
from and written to ``...w_1.kernel``; no transpose (torch's [out, in] needs one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer_spec import Config, init_params, load_params, param_schema, parent_of
from transformer_spec.io import check_weights_to_load

from .model import MODEL_CLASSES


def _to_flax_name(parent: Any, leaf: str) -> str:  # differs: framework-params
    # nnx.Linear calls its [in, out] matrix ``kernel``; the canonical name is ``weight``.
    return "kernel" if isinstance(parent, nnx.Linear) and leaf == "weight" else leaf


def _check_x64(dtype: str) -> None:  # differs: jax-x64
    # Without 64-bit mode JAX has no float64: jnp.asarray(x, "float64") warns and returns
    # float32, so a float64 model would silently be a float32 one.
    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise TypeError(
            "float64 weights need JAX's 64-bit mode: call "
            "jax.config.update('jax_enable_x64', True) at start-up, before any JAX array is "
            "created (without it JAX silently truncates float64 to float32), or pass "
            "dtype='float32'"
        )


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
    # differs: jax-x64
    _check_x64(dtype)
    module = module_class(config, dtype)
    for name in schema:
        parent, leaf = parent_of(module, name)
        leaf = _to_flax_name(parent, leaf)
        # A copy (the module owns its weights) in ``dtype``, cast by NumPy and put on the default
        # device (speed: jnp.array would compile an XLA program for each new shape it casts). An
        # nnx.Param is replaced through ``param[...] = array`` (``.value =`` is deprecated).
        getattr(parent, leaf)[...] = jax.device_put(np.array(params[name], dtype=jnp.dtype(dtype)))
    module.eval()  # (torch's eval returns the module, NNX's returns None)
    return module


def to_params(module: Any) -> dict[str, np.ndarray]:
    """The module's weights under their canonical names, as NumPy arrays (copied off the device)."""
    params = {}
    for name in param_schema(module.config, module.schema):
        parent, leaf = parent_of(module, name)
        leaf = _to_flax_name(parent, leaf)
        params[name] = np.array(getattr(parent, leaf)[...])
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
