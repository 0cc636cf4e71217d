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

    def call(self, fn, *args, **kwargs) -> Any:
        """Run ``fn`` on backend arrays made from the NumPy ``args``; return NumPy results.
        A whole model runs the way its backend runs models fast: ``impl.compiled(model)``."""
        if getattr(fn, "schema", None) == "model":  # a whole model (components have check_inputs too)
            fn = self.impl.compiled(fn)
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

    def __init__(self):
        self.torch = importlib.import_module("torch")
        self.torch.set_float32_matmul_precision("highest")  # no TF32 on GPUs
        self.impl = importlib.import_module(package(self.name))

    def asarray(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x).reshape(x.shape))  # ascontiguousarray makes 0-d 1-d

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

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
