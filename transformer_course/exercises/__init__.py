"""Every exercise of the course, by the name of the function the learner writes.

One module per chapter (``chNN_<topic>.py``), each with a list ``EXERCISES``; this package
collects them. The solutions are not here: they are in ``notebooks/solutions/``, and the
checker never needs them (each backend's own code is the answer).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..check import Exercise


def _collect() -> dict[str, Exercise]:
    found: dict[str, Exercise] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for exercise in getattr(module, "EXERCISES", []):
            if exercise.name in found:
                raise ValueError(f"two exercises are named {exercise.name!r} ({info.name})")
            found[exercise.name] = exercise
    return found


EXERCISES = _collect()


def chapter(stem: str) -> list[Exercise]:
    """The exercises of one notebook, e.g. chapter("01_masks"), in the order they were written."""
    return [e for e in EXERCISES.values() if e.chapter == stem]
