"""Seeded initialisation in NumPy: the same numbers for every backend."""

from __future__ import annotations

import math

import numpy as np

from .config import Config
from .schema import param_schema

Params = dict[str, np.ndarray]


def init_params(
    config: Config,
    seed: int = 0,
    dtype: str | np.dtype = "float32",
    component: str = "model",
    nonzero_biases: bool = False,
) -> Params:
    """A canonical weight dict for ``component`` of ``config``.

    Linear weights: Xavier/Glorot uniform (the paper's reference code). Embedding
    tables: normal with std d_model**-0.5 when embeddings are scaled by sqrt(d_model)
    (so the scaled vectors have unit variance), else BERT's 0.02. LayerNorm: weight 1,
    bias 0; linear biases 0.

    ``nonzero_biases=True`` draws biases and LayerNorm parameters at random too. The
    tests use it: with zero biases and unit norms a backend that forgot a bias, or
    added it to the wrong axis, would still agree with the reference.
    """
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, shape in param_schema(config, component).items():
        *path, leaf = name.split(".")
        owner = path[-1] if path else ""  # the module that holds the leaf
        if owner == "" or owner.endswith("norm"):  # a LayerNorm (alone, or inside a model)
            base = 1.0 if leaf == "weight" else 0.0
            value = base + (0.1 * rng.standard_normal(shape) if nonzero_biases else np.zeros(shape))
        elif leaf.endswith("bias"):  # a Linear's bias, or the generator's logits_bias
            value = 0.1 * rng.standard_normal(shape) if nonzero_biases else np.zeros(shape)
        elif owner in ("token", "position", "token_type"):
            std = config.d_model**-0.5 if config.scale_embeddings else 0.02
            value = std * rng.standard_normal(shape)
        else:
            fan_in, fan_out = shape
            limit = math.sqrt(6.0 / (fan_in + fan_out))
            value = rng.uniform(-limit, limit, shape)
        params[name] = np.ascontiguousarray(value, dtype=dtype)
    return params
