"""The backends' names (``BACKENDS``, in ``names.py``) and adapters that drive a backend with NumPy
arrays in and NumPy arrays out.

``get_backend("torch").call(model, ids)`` builds the backend's arrays from NumPy, runs the
backend's own code and hands NumPy back. The CLI, the test suite, the pitfalls, the docs'
measurements and the benchmark all go through here, so none of them imports a backend
package by name. Imports ``transformer_spec`` only; a backend's framework is imported when
its adapter is first asked for. ``tolerances`` says what "equal" means between two backends'
outputs: the one table the test suite and ``transformer-ref trace`` share.
"""

from .adapters import ADAPTERS, Backend, available_backends, get_backend
from .names import BACKENDS, package
from .tolerances import TOLERANCE, max_relative_difference, tolerance

__all__ = [
    "ADAPTERS", "BACKENDS", "TOLERANCE", "Backend", "available_backends", "get_backend",
    "max_relative_difference", "package", "tolerance",
]  # fmt: skip
