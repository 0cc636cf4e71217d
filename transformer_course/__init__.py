"""The course's helpers: what a notebook imports to show, run, compare and check.

- ``show(file, name)``: the definition of ``name`` in every backend's ``file``, side by side,
  read from the files when the cell runs; ``show_shared(fn)`` a function the three share
  (``transformer_run``, ``transformer_convert``), read from its file.
- ``each(f)`` and ``agreement(results)``: run one thing in every installed backend on the
  same NumPy inputs, and the table of how far apart the results are.
- ``check(fn)``: your answer to an exercise against every backend's own code.
"""

from .check import Exercise, Mistake, Result, check, check_exercise
from .compare import agreement, backends, each, relative_difference
from .source import find, show, show_shared

__all__ = [
    "Exercise",
    "Mistake",
    "Result",
    "agreement",
    "backends",
    "check",
    "check_exercise",
    "each",
    "find",
    "relative_difference",
    "show",
    "show_shared",
]
