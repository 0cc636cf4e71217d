"""The backends' names, written once: every listing (the CLI's choices, the test suite's
parametrization, the pitfalls, the docs' columns, the benchmark) reads this tuple.

``numpy`` comes first: it is the reference the other two are held to. Each name is also
its package's prefix (``numpy`` -> ``numpy_impl``).
"""

from __future__ import annotations

BACKENDS = ("numpy", "jax", "torch")


def package(backend: str) -> str:
    """'torch' -> 'torch_impl', the package that holds that backend."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    return f"{backend}_impl"
