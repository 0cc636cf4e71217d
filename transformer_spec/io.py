"""Save and load canonical weights as safetensors, with the Config in the metadata."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from .checks import WeightsFileError, check_params
from .config import Config
from .schema import param_schema

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
