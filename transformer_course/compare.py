"""Run one thing in every installed backend on the same NumPy inputs; show how far apart the results are.

``each(f)`` calls ``f(backend)`` for every installed backend (``backend.call(fn, *numpy_arrays)``
runs the backend's own code and gives NumPy back) and returns ``{backend name: result}``;
``agreement(results)`` is the table of each result's largest difference from the NumPy one,
relative to the NumPy one's largest magnitude (the measure the test suite uses).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_backends.adapters import Backend, available_backends, get_backend
from transformer_backends.tolerances import max_relative_difference


def backends() -> list[Backend]:
    """The adapters of the installed backends, NumPy (the reference) first."""
    return [get_backend(name) for name in available_backends()]


def each(f: Callable[[Backend], Any]) -> dict[str, Any]:
    """``{name: f(backend)}`` over the installed backends."""
    return {backend.name: f(backend) for backend in backends()}


def relative_difference(result: Any, reference: Any) -> float:
    """max |result - reference| / max |reference| over the finite elements (0 when both are all zeros);
    infinite where a NaN or an infinity of one is not the same in the other."""
    with np.errstate(invalid="ignore"):  # a signalling NaN (float32 0x7F800001) cast to float64: still a NaN
        result, reference = np.asarray(result, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if result.shape != reference.shape:
        raise ValueError(f"shapes differ: {result.shape} against the reference's {reference.shape}")
    finite = np.isfinite(result) & np.isfinite(reference)  # NaN and the infinities must sit in the same places
    if not np.array_equal(result[~finite], reference[~finite], equal_nan=True):
        return float("inf")
    return max_relative_difference(result[finite], reference[finite])  # the suite's measure on the rest


class Agreement:
    """One row per backend: shape, dtype, and the relative difference from the reference."""

    def __init__(self, results: dict[str, Any], reference: str = "numpy"):
        self.rows = []
        for name, value in results.items():
            value = np.asarray(value)
            difference = relative_difference(value, results[reference])
            self.rows.append((name, value.shape, value.dtype, difference))
        self.worst = max(row[3] for row in self.rows)
        self.reference = reference

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        head = f"{'backend':8} {'shape':18} {'dtype':9} max |x - {self.reference}| / max |{self.reference}|"
        lines = [f"{n:8} {str(s):18} {str(d):9} {e:.1e}" for n, s, d, e in self.rows]
        return "\n".join([head, *lines])

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><td>{n}</td><td>{s}</td><td>{d}</td><td>{e:.1e}</td></tr>" for n, s, d, e in self.rows
        )
        head = f"max |x &minus; {html.escape(self.reference)}| / max |{html.escape(self.reference)}|"
        return (
            f'<table class="course-agreement"><tr><th>backend</th><th>shape</th><th>dtype</th>'
            f"<th>{head}</th></tr>{cells}</table>"
        )


def agreement(results: dict[str, Any], reference: str = "numpy") -> Agreement:
    return Agreement(results, reference)
