"""One adapter per backend: NumPy arrays in, NumPy arrays out, the backend's own code between.

The command line, the shared test suite, the pitfalls, the docs' measurements and the
benchmark drive the backends through these adapters. None of them imports a backend
directly: they call the same public names on ``backend.impl`` (the three backends export
identical names, so one body serves all).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from transformer_spec import ModelOutput

from .names import BACKENDS, package


class Backend:
    name: str
    impl: Any

    def asarray(self, x: np.ndarray) -> Any:
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def build(self, module_class_name: str, config, params, dtype: str | None = None) -> Any:
        return self.impl.from_params(getattr(self.impl, module_class_name), config, params, dtype)

    def synchronize(self, result: Any) -> Any:
        """Wait until ``result`` is computed (JAX dispatches asynchronously)."""
        return result

    # Whether a whole model runs compiled by default: JAX's is jit-compiled (how JAX runs: op by op
    # it dispatches each operation on its own), NumPy has no compiler (its compiled(model) is the model).
    # torch runs eagerly by default, as torch does: torch.compile costs tens of seconds per model and
    # shape on a CPU, so it is the user's choice (``compiled(model)``, the command line's --compile).
    compiles_by_default = True

    def runner(self, model) -> Any:
        """The callable a whole model runs with by default: ``impl.compiled(model)`` where the
        backend compiles by default (JAX), the model itself otherwise (torch: eager)."""
        return self.impl.compiled(model) if self.compiles_by_default else model

    def compiled_for_decoding(self, model) -> Any:
        """``model`` with what its decoding steps call compiled: torch compiles the decoder and the
        output projection in place (``torch_impl.compiled.compile_layers``); JAX's steps are always
        jit-compiled and NumPy has no compiler: the model as it is."""
        return model

    def call(self, fn, *args, **kwargs) -> Any:
        """Run ``fn`` on backend arrays made from the NumPy ``args``; return NumPy results.
        A whole model runs the way its backend runs models by default: ``runner(model)``."""
        if getattr(fn, "schema", None) == "model":  # a whole model (components have check_inputs too)
            fn = self.runner(fn)
        args = [self._in(a) for a in args]
        kwargs = {k: self._in(v) for k, v in kwargs.items()}
        return self._out(fn(*args, **kwargs))

    def _in(self, x):
        return self.asarray(x) if isinstance(x, np.ndarray) else x

    def _out(self, x):
        if isinstance(x, ModelOutput):
            return ModelOutput(**{f.name: self._out(getattr(x, f.name)) for f in dataclasses.fields(x)})
        if isinstance(x, (tuple, list)):
            return type(x)(self._out(v) for v in x)
        if x is None or isinstance(x, (int, float, str, bool)):
            return x
        return self.to_numpy(x)

    def __repr__(self) -> str:
        return self.name


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self):
        self.impl = importlib.import_module(package(self.name))

    def asarray(self, x):
        return np.array(x)

    def to_numpy(self, x):
        return np.asarray(x)


class JaxBackend(Backend):
    name = "jax"

    def __init__(self):
        import jax

        jax.config.update("jax_enable_x64", True)  # without it JAX silently computes float64 in float32
        self.jnp = importlib.import_module("jax.numpy")
        self.impl = importlib.import_module(package(self.name))

    def asarray(self, x):
        return self.jnp.asarray(x)

    def to_numpy(self, x):
        return np.asarray(x)

    def synchronize(self, result):
        import jax

        return jax.block_until_ready(result)


class TorchBackend(Backend):
    name = "torch"
    compiles_by_default = False  # eager, as torch runs; torch.compile on request (compiled(model))

    def __init__(self):
        self.torch = importlib.import_module("torch")
        self.torch.set_float32_matmul_precision("highest")  # no TF32 on GPUs
        self.impl = importlib.import_module(package(self.name))

    def asarray(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x).reshape(x.shape))  # ascontiguousarray makes 0-d 1-d

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def compiled_for_decoding(self, model):
        return importlib.import_module("torch_impl.compiled").compile_layers(model)

    def call(self, fn, *args, **kwargs):
        with self.torch.no_grad():
            return super().call(fn, *args, **kwargs)


ADAPTERS = {adapter.name: adapter for adapter in (NumpyBackend, JaxBackend, TorchBackend)}  # one per BACKENDS
_CACHE: dict[str, Backend] = {}


def available_backends() -> list[str]:
    """Names of the backends whose framework is installed."""
    found = []
    for name in BACKENDS:
        try:
            get_backend(name)
        except ImportError:
            continue
        found.append(name)
    return found


def get_backend(name: str) -> Backend:
    """The adapter for ``name``; raises ImportError when that backend is not installed."""
    if name not in _CACHE:
        _CACHE[name] = ADAPTERS[name]()
    return _CACHE[name]
