"""Exercises and their checker: your function against every backend's own code, on the same inputs.

``check(fn)`` finds the exercise by the function's name (``check(fn, "causal_mask")`` names
it), runs ``fn`` on each of the exercise's cases (NumPy inputs, float64), runs every
installed backend's real code on the same inputs, and says what is wrong: an exception, the
shape, the dtype, the first differing element with both values, and, when the answer equals
a known wrong answer on that case, which classic mistake it is and why it is wrong.
A wrong or unfinished answer never raises: the notebook keeps running; the result says it.
"""

from __future__ import annotations

import copy
import html
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .compare import backends, relative_difference

Case = tuple[str, dict[str, Any]]  # (what the case is, keyword arguments)


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer: its short name, why it is wrong, and the wrong code written out."""

    name: str
    why: str
    answer: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    name: str  # the function the learner writes (check finds the exercise by it)
    chapter: str  # the notebook, e.g. "04_attention"
    task: str  # what to write: the signature, the shapes, the rule
    cases: Callable[[], list[Case]]  # the inputs, ordinary and edge cases
    expected: Callable[[Any, dict[str, Any]], Any]  # (backend adapter, inputs) -> the backend's own answer
    mistakes: tuple[Mistake, ...] = ()
    tolerance: float = 1e-9  # relative to the reference's largest magnitude

    def __post_init__(self):
        if not self.cases():
            raise ValueError(f"exercise {self.name!r} has no cases")


@dataclass
class Result:
    exercise: str
    ok: bool
    message: str
    mistake: str | None = None  # the name of the classic mistake the answer matched, if any
    agreement: dict[str, float] = field(default_factory=dict)  # backend -> relative difference

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{'correct' if self.ok else 'not yet'}: {self.exercise}: {self.message}"

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.ok else "#b35900"
        title = "Correct" if self.ok else "Not yet"
        return (
            f'<div class="course-check" style="border-left:4px solid {colour};padding:4px 8px">'
            f"<b style=\"color:{colour}\">{title}</b> &mdash; <code>{html.escape(self.exercise)}</code>: "
            f"<span style=\"white-space:pre-wrap\">{html.escape(self.message)}</span></div>"
        )


def _fresh(inputs: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(inputs)  # an answer that writes into its inputs cannot change the next call's


def _same(got: np.ndarray, want: np.ndarray, tolerance: float) -> bool:
    if got.shape != want.shape:
        return False
    if want.dtype == bool or got.dtype == bool:
        return got.dtype == want.dtype and bool(np.array_equal(got, want))
    if not (np.issubdtype(got.dtype, np.number) and np.issubdtype(want.dtype, np.number)):
        return False
    return relative_difference(got, want) <= tolerance  # NaN and the infinities compared by place


def _as_array(value: Any) -> np.ndarray | None:
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        return None
    if array.dtype == object:
        return None
    return array


def _first_difference(got: np.ndarray, want: np.ndarray, tolerance: float) -> str:
    finite = np.abs(want[np.isfinite(want)]) if want.dtype != bool else np.array([1.0])
    scale = float(finite.max()) if finite.size else 1.0
    if want.dtype == bool:
        wrong = got != want
    else:
        wrong = ~np.isclose(got, want, rtol=0.0, atol=tolerance * max(scale, 1e-300), equal_nan=True)
    if want.ndim == 0:  # one number: nothing to index
        return f"expected {want.item()!r}, got {got.item()!r}"
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    count = int(wrong.sum())
    return (
        f"the first differing element is [{', '.join(map(str, index))}]: expected {want[index].item()!r}, "
        f"got {got[index].item()!r} ({count} of {want.size} elements differ)"
    )


def _matching_mistake(exercise: Exercise, inputs: dict[str, Any], got: np.ndarray) -> Mistake | None:
    for mistake in exercise.mistakes:
        try:
            wrong = _as_array(mistake.answer(**_fresh(inputs)))
        except Exception:  # noqa: BLE001 - a wrong answer that cannot run on this case matches nothing
            continue
        if wrong is not None and _same(got, wrong, exercise.tolerance):
            return mistake
    return None


def _expected(exercise: Exercise, inputs: dict[str, Any]) -> tuple[np.ndarray, dict[str, float]]:
    """The NumPy backend's answer, and every backend's distance from it (they must agree)."""
    answers = {b.name: np.asarray(exercise.expected(b, _fresh(inputs))) for b in backends()}
    reference = answers["numpy"]
    spread = {}
    for name, answer in answers.items():
        if reference.dtype == bool:
            spread[name] = 0.0 if np.array_equal(answer, reference) else 1.0
        else:
            spread[name] = relative_difference(answer, reference)
    if max(spread.values()) > exercise.tolerance:
        raise AssertionError(f"the backends disagree on {exercise.name}: {spread}")  # the checker's own fault
    return reference, spread


def check_exercise(exercise: Exercise, fn: Callable[..., Any]) -> Result:
    """Run ``fn`` on every case of ``exercise`` against every backend; the first problem found, or success."""
    cases = exercise.cases()
    worst: dict[str, float] = {}
    for number, (description, inputs) in enumerate(cases, 1):
        where = f"on case {number} of {len(cases)} ({description})"
        want, spread = _expected(exercise, inputs)
        worst = {k: max(worst.get(k, 0.0), v) for k, v in spread.items()}
        try:
            got_value = fn(**_fresh(inputs))
        except Exception as error:  # noqa: BLE001 - the learner's code: say what it raised, keep the notebook running
            last = traceback.extract_tb(error.__traceback__)[-1]
            return Result(
                exercise.name, False,
                f"{where}, your function raised {type(error).__name__}: {error} (line {last.lineno})",
            )  # fmt: skip
        got = _as_array(got_value)
        if got is None:
            return Result(exercise.name, False, f"{where}, expected an array, got {type(got_value).__name__}")
        if _same(got, want, exercise.tolerance):
            continue
        mistake = _matching_mistake(exercise, inputs, got)
        if got.shape != want.shape:
            problem = f"expected shape {want.shape}, got {got.shape}"
        elif (want.dtype == bool) != (got.dtype == bool):
            problem = f"expected dtype {want.dtype}, got {got.dtype}"
        else:
            problem = _first_difference(got, want, exercise.tolerance)
        message = f"{where}, {problem}."
        if mistake is not None:
            message += f"\nThis is a classic mistake: {mistake.name}. {mistake.why}"
        return Result(exercise.name, False, message, mistake.name if mistake else None)
    names = ", ".join(f"{k} {v:.0e}" for k, v in worst.items())
    return Result(
        exercise.name, True,
        f"equal to every backend's own code on all {len(cases)} cases (the backends' spread: {names})",
        agreement=worst,
    )  # fmt: skip


def check(fn: Callable[..., Any], name: str | None = None) -> Result:
    """Check ``fn`` against the exercise of the same name (or ``name``)."""
    from .exercises import EXERCISES

    name = name or getattr(fn, "__name__", None)
    if name not in EXERCISES:
        raise KeyError(f"no exercise named {name!r}; expected one of {sorted(EXERCISES)}")
    return check_exercise(EXERCISES[name], fn)
