"""Adapters that drive a backend with NumPy arrays in and NumPy arrays out.

``get_backend("torch").call(model, ids)`` builds the backend's arrays from NumPy, runs the
backend's own code and hands NumPy back. The CLI, the test suite, the pitfalls, the docs'
measurements and the benchmark all go through here, so none of them imports a backend
package by name. Imports ``transformer_spec`` only; a backend's framework is imported when
its adapter is first asked for.
"""

from .adapters import ADAPTERS, Backend, available_backends, get_backend

__all__ = ["ADAPTERS", "Backend", "available_backends", "get_backend"]
