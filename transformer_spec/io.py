"""Save and load canonical weights as safetensors, with the Config in the metadata; check a
weight dict before a backend loads it into a module."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from .checks import WeightsFileError, check_dtype_request, check_params, check_params_dtype
from .config import Config
from .schema import Schema, param_schema

FORMAT = "transformer_spec/1"


def save_params(path: str | os.PathLike, params: Mapping[str, np.ndarray], config: Config) -> None:
    """Write ``params`` (checked against ``config``'s schema) and the config to ``path``."""
    check_params({k: v.shape for k, v in params.items()}, param_schema(config))
    tensors = {k: np.ascontiguousarray(v) for k, v in params.items()}
    save_file(tensors, os.fspath(path), metadata={"format": FORMAT, "config": config.to_json()})


def load_params(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], Config]:
    """Read a file written by :func:`save_params`; returns ``(params, config)``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightsFileError(f"{path!r} is not a file; expected a transformer_spec safetensors weights file")
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise WeightsFileError(
            f"{path!r} is not a safetensors file ({error}); expected a transformer_spec weights file"
        ) from None
    if metadata.get("format") != FORMAT or "config" not in metadata:
        raise WeightsFileError(
            f"{path!r} is a safetensors file without transformer_spec metadata: expected "
            f"format={FORMAT!r} and a config, got metadata keys {sorted(metadata)}"
        )
    try:
        config = Config.from_dict(json.loads(metadata["config"]))
    except (ValueError, TypeError) as error:
        raise WeightsFileError(f"{path!r} holds an invalid config: {error}") from None
    params = load_file(path)
    check_params({k: v.shape for k, v in params.items()}, param_schema(config), what=f"the config stored in {path!r}")
    return params, config


def check_weights_to_load(
    module_class: type, config: Config, params: Mapping[str, Any], dtype: str | None
) -> tuple[Schema, str]:
    """Before a backend's ``from_params(module_class, config, params, dtype)`` loads ``params``:
    every key fits the schema of ``module_class.schema`` (``WeightsError`` names each one that
    does not), the weights share one float dtype, and ``dtype`` (None: theirs) is float32 or
    float64. -> (that schema, the dtype to load the weights in)."""
    schema = param_schema(config, module_class.schema)
    check_params({k: tuple(np.shape(v)) for k, v in params.items()}, schema, what=f"{module_class.__name__}'s config")
    found = check_params_dtype({k: str(np.asarray(v).dtype) for k, v in params.items()})
    dtype = dtype or found
    check_dtype_request(dtype)
    return schema, dtype
