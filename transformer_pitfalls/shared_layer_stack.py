"""The pitfall "shared-layer-stack": The same layer object repeated N times in a stack."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_spec import init_params, param_schema

from .common import CONFIG, DTYPE, _backend, _g
from .registry import BACKENDS, Demonstration, register, source


def wrong_stack_of_one_layer(encoder, container):
    encoder_layer = encoder.layers[0]
    # from-scratch: nn.ModuleList([encoder_layer for _ in range(num_layers)]) -- N references to ONE layer
    encoder.layers = container([encoder_layer for _ in range(len(encoder.layers))])
    return encoder


def ours_encoder(backend, config, params, x):
    encoder = backend.build("Encoder", config, params)  # N EncoderLayer objects, each loaded with its own weights
    return encoder, encoder(x)[0]  # (B, T, d_model)


def _layer_container(backend: str) -> Callable:
    """What a stack of layers lives in: where each framework looks for parameters."""
    if backend == "torch":
        from torch import nn

        return nn.ModuleList
    if backend == "jax":
        from flax import nnx

        return nnx.List
    return list


def _distinct_parameters(module: Any, schema: dict[str, tuple[int, ...]]) -> int:
    """How many weights ``module`` really holds: a schema entry whose owning object (a Linear, a
    LayerNorm) is the same object as another entry's counts once. Works on any backend's modules."""
    sizes = {}
    for name, shape in schema.items():
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        sizes[(id(owner), leaf)] = math.prod(shape)
    return sum(sizes.values())


@register(
    "shared-layer-stack",
    "The same layer object repeated N times in a stack",
    BACKENDS,
    tutorials=("from-scratch",),
)
def shared_layer_stack(backend: str) -> Demonstration:
    """The from-scratch tutorial builds one EncoderLayer and passes it to
    Encoder(encoder_layer, num_layers), which fills its list with that same object N times.
    Every "layer" is one layer: its weights are shared, the model has 1/N of the parameters it prints, and a checkpoint
    with N different layers cannot be loaded into it. Nothing raises: a Python list,
    nn.ModuleList and nnx.List all accept the same object twice (torch and Flax then count
    its parameters once). Each layer must be constructed anew."""
    b = _backend(backend)
    config = CONFIG.replace(num_encoder_layers=3)
    params = init_params(config, seed=4, dtype=DTYPE, component="encoder", nonzero_biases=True)
    x = np.random.default_rng(5).standard_normal((2, 5, config.d_model))  # (B, T, d_model)
    ours, ours_out = ours_encoder(b, config, params, b.asarray(x))
    wrong, _ = ours_encoder(b, config, params, b.asarray(x))  # built the same way, then stacked wrong
    wrong = wrong_stack_of_one_layer(wrong, _layer_container(backend))
    wrong_out = wrong(b.asarray(x))[0]
    schema = param_schema(config, "encoder")
    numbers = {
        "num_layers": config.num_encoder_layers,
        "wrong_distinct_layers": len({id(layer) for layer in wrong.layers}),
        "ours_distinct_layers": len({id(layer) for layer in ours.layers}),
        "wrong_parameters": _distinct_parameters(wrong, schema),
        "ours_parameters": _distinct_parameters(ours, schema),
        "schema_parameters": sum(math.prod(s) for s in schema.values()),
        "max_abs_output_difference": float(np.abs(b.to_numpy(wrong_out) - b.to_numpy(ours_out)).max()),
    }
    return Demonstration(
        pitfall="shared-layer-stack",
        backend=backend,
        wrong_code=source(wrong_stack_of_one_layer),
        ours_code=source(ours_encoder),
        wrong=(
            f"{numbers['num_layers']} layers listed, {numbers['wrong_distinct_layers']} layer object, "
            f"{numbers['wrong_parameters']} parameters; output off by {_g(numbers['max_abs_output_difference'])}"
        ),
        ours=(
            f"{numbers['ours_distinct_layers']} layer objects, {numbers['ours_parameters']} parameters "
            f"(= the weight schema's {numbers['schema_parameters']})"
        ),
        numbers=numbers,
    )
