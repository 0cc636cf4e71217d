"""Compilation, applied to a model from outside it.

A model's ``__call__`` is the plain forward pass, the same text as NumPy's ``__call__``
and torch's ``forward``; called directly it runs eagerly, op by op. Compilation is
applied from outside, as Flax's own examples do: ``compiled(model)`` returns a callable
with the same arguments that (1) checks the inputs eagerly, on the concrete arrays the
caller passed, then (2) runs the whole forward pass as one XLA program, compiled by
``jax.jit`` on first use for each (model structure, flags, input shapes and dtypes).

Why the checks run outside jit: inside a trace an array has a shape and a dtype but
no values, so "is every id in [0, vocab)" cannot be asked there; and jit converts its
inputs first (without ``jax_enable_x64``, int64 -> int32, float64 -> float32), so a
dtype error raised inside would name the converted dtype, not the caller's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
from flax import nnx

from transformer_spec import ModelOutput
from transformer_spec.checks import inputs_checked

from .layers import dropout_active


def _run(model: nnx.Module, arrays: tuple, flags: tuple) -> ModelOutput:  # differs: jax-jit
    """``model(*arrays, *flags)`` with the inputs already checked (``compiled`` did, eagerly)."""
    with inputs_checked():
        return model(*arrays, *flags)


# Flax NNX modules are JAX pytrees: their arrays (parameters and buffers) are the leaves,
# traced; everything else (the config, the activation function, the layer structure) is
# static and part of the cache key. ``arrays`` is a tuple of arrays and Nones (None is an
# empty pytree node, so "no mask" and "a mask" compile separately). Plain ``jax.jit``
# flattens the module in about a millisecond per call; ``nnx.jit`` walks the module graph
# and costs ~10x that. But plain ``jax.jit`` returns only its outputs: state the call
# changes inside the module is dropped. With dropout active (training mode, rate > 0) each
# call advances the dropout streams' counters, and under plain ``jax.jit`` every call would
# draw the same masks; ``nnx.jit`` writes the new counters back into the module.
_plain_jit_run = jax.jit(_run, static_argnames="flags")
_nnx_jit_run = nnx.jit(_run, static_argnames="flags")
_FLAGS = ("return_attentions", "return_hidden_states")


def compiled(model: nnx.Module) -> Callable[..., ModelOutput]:
    """``model`` as one XLA program: a callable with the model's arguments that checks them
    eagerly (``model.check_inputs``, which also converts lists and other frameworks' arrays),
    then runs the jit-compiled forward pass on what it returned."""
    signature = inspect.signature(model.__call__)  # read once, not on every call

    def call(*args, **kwargs) -> ModelOutput:  # differs: jax-jit
        inputs = signature.bind(*args, **kwargs).arguments  # by name
        flags = tuple(bool(inputs.pop(name, False)) for name in _FLAGS)
        arrays = model.check_inputs(**inputs)  # the arrays, in the forward's order
        run = _nnx_jit_run if model.config.dropout > 0 and dropout_active(model) else _plain_jit_run
        return run(model, arrays, flags)

    return call
