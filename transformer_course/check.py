"""Exercises and their checker: your function against every backend's own code, on the same inputs.

``check(fn)`` finds the exercise by the function's name (``check(fn, "causal_mask")`` names
it), runs ``fn`` on each of the exercise's cases (NumPy inputs, float64), runs every
installed backend's real code on the same inputs, and says what is wrong: an exception, the
shape, the dtype, the first differing element with both values, and, when the answer equals
a known wrong answer on that case, which classic mistake it is and why it is wrong. An exercise
whose task writes into an argument (a cache's buffer) has that argument compared after the call
too; an error raised inside NumPy is reported at the line of the learner's own code that called
it; a number that differs is put beside the parts it is made of, when the exercise can name them.
A wrong or unfinished answer never raises: the notebook keeps running; the result says it.
"""

from __future__ import annotations

import copy
import html
import itertools
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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
    # The arguments the task says the function writes into (a cache's buffers). With any, ``expected``
    # returns (answer, {argument: what it holds after the call}) and both are compared.
    writes: tuple[str, ...] = ()
    # For an answer that is one number: (inputs) -> {part: its share}, the parts that add up to the
    # expected number (a model's weights by kind), so that a wrong total can be traced to the parts.
    parts: Callable[[dict[str, Any]], dict[str, float]] | None = None

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
            f'<b style="color:{colour}">{title}</b> &mdash; <code>{html.escape(self.exercise)}</code>: '
            f'<span style="white-space:pre-wrap">{html.escape(self.message)}</span></div>'
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


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.6g}"


def _about_a_number(got: np.ndarray, want: np.ndarray, parts: dict[str, float] | None) -> str:
    """How a wrong number differs: by how much, and, where the parts of the expected number are known,
    which of them the difference is exactly made of (a count that left out the biases, say)."""
    if not (np.issubdtype(got.dtype, np.number) and np.isfinite(got) and np.isfinite(want)):
        return ""
    difference = float(got) - float(want)
    said = f"{_number(abs(difference))} {'more' if difference > 0 else 'less'} than expected"
    if not parts:
        return f" ({said}, {abs(difference) / max(abs(float(want)), 1e-300):.2%} of it)"
    names = [name for name, value in parts.items() if value]
    # A total that is short by exactly a few of its parts left those out (a count without the biases).
    # A total that is over says nothing about which part: the extra is not in the model.
    for size in range(1, min(len(names), 4) + 1) if difference < 0 else ():
        for chosen in itertools.combinations(names, size):
            total = sum(parts[name] for name in chosen)
            if np.isclose(total, abs(difference), rtol=1e-12, atol=0.0):
                made_of = " + ".join(f"{name} ({_number(parts[name])})" for name in chosen)
                return f" ({said}: exactly {made_of}, left out)"
    listed = ", ".join(f"{name} {_number(value)}" for name, value in parts.items())
    return f" ({said}; the expected number is made of: {listed})"


def _library_folders() -> tuple[str, ...]:
    """Where code that is not the learner's lives: Python's own library, the installed packages, and
    this project's packages (wherever it is installed from)."""
    paths = sysconfig.get_paths()
    folders = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    root = Path(__file__).resolve().parents[1]
    product = [*root.glob("transformer_*/__init__.py"), *root.glob("*_impl/__init__.py")]
    folders |= {str(package.parent) for package in product}
    folders |= {str(Path(module.__file__).parent) for module in (np,)}
    return tuple(sorted(str(Path(f).resolve()) + "/" for f in folders))


def _your_line(error: BaseException) -> str:
    """The line of the learner's code the error came through: the innermost frame outside Python's
    library, the installed packages and this project (the innermost frame of an error raised inside
    np.stack is in NumPy; the learner's notebook cell has no such line)."""
    frames = traceback.extract_tb(error.__traceback__)
    library = _library_folders()

    def theirs(frame: traceback.FrameSummary) -> bool:
        return not frame.filename.startswith("<frozen") and not str(Path(frame.filename).resolve()).startswith(library)

    yours = [frame for frame in frames if theirs(frame)]
    frame = yours[-1] if yours else frames[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    inside = "" if frame is frames[-1] else f", inside {frames[-1].name}()"
    return (
        f"(line {frame.lineno} of your code{code}{inside})" if yours else f"(line {frame.lineno} of {frame.filename})"
    )


Outcome = tuple[np.ndarray, dict[str, np.ndarray]]  # (the answer, {argument written into: what it holds after})


def _outcome(exercise: Exercise, value: Any) -> Outcome:
    """A backend's expected answer as arrays (and, for an exercise that writes into arguments, those)."""
    if exercise.writes:
        answer, written = value
        return np.asarray(answer), {name: np.asarray(written[name]) for name in exercise.writes}
    return np.asarray(value), {}


def _run(exercise: Exercise, fn: Callable[..., Any], inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``fn`` on a fresh copy of the inputs: what it returned, and the arguments the task writes into."""
    arguments = _fresh(inputs)
    value = fn(**arguments)
    return value, {name: arguments[name] for name in exercise.writes}


def _matches(exercise: Exercise, got: np.ndarray, written: dict[str, Any], want: Outcome) -> bool:
    if not _same(got, want[0], exercise.tolerance):
        return False
    for name, after in want[1].items():
        array = _as_array(written[name])
        if array is None or not _same(array, after, exercise.tolerance):
            return False
    return True


def _matching_mistake(
    exercise: Exercise, inputs: dict[str, Any], got: np.ndarray, written: dict[str, Any]
) -> Mistake | None:
    for mistake in exercise.mistakes:
        try:
            with np.errstate(all="ignore"):  # a known wrong answer's overflow is not the learner's to read
                value, its_written = _run(exercise, mistake.answer, inputs)
        except Exception:  # noqa: BLE001 - a wrong answer that cannot run on this case matches nothing
            continue
        wrong = _as_array(value)
        if wrong is not None and _matches(
            exercise, got, written, (wrong, {k: np.asarray(v) for k, v in its_written.items()})
        ):
            return mistake
    return None


def _distance(answer: np.ndarray, reference: np.ndarray) -> float:
    if reference.dtype == bool:
        return 0.0 if np.array_equal(answer, reference) else 1.0
    return relative_difference(answer, reference)


def _expected(exercise: Exercise, inputs: dict[str, Any]) -> tuple[Outcome, dict[str, float]]:
    """The NumPy backend's answer, and every backend's distance from it (they must agree)."""
    answers = {b.name: _outcome(exercise, exercise.expected(b, _fresh(inputs))) for b in backends()}
    reference = answers["numpy"]
    spread = {}
    for name, (answer, written) in answers.items():
        distances = [_distance(answer, reference[0])]
        distances += [_distance(written[key], reference[1][key]) for key in exercise.writes]
        spread[name] = max(distances)
    if max(spread.values()) > exercise.tolerance:
        raise AssertionError(f"the backends disagree on {exercise.name}: {spread}")  # the checker's own fault
    return reference, spread


def _problem(exercise: Exercise, inputs: dict[str, Any], got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"expected shape {want.shape}, got {got.shape}"
    if (want.dtype == bool) != (got.dtype == bool):
        return f"expected dtype {want.dtype}, got {got.dtype}"
    problem = _first_difference(got, want, exercise.tolerance)
    if want.ndim == 0:
        problem += _about_a_number(got, want, exercise.parts(inputs) if exercise.parts else None)
    return problem


def check_exercise(exercise: Exercise, fn: Callable[..., Any]) -> Result:
    """Run ``fn`` on every case of ``exercise`` against every backend; the first problem found, or success."""
    cases = exercise.cases()
    worst: dict[str, float] = {}
    for number, (description, inputs) in enumerate(cases, 1):
        where = f"on case {number} of {len(cases)} ({description})"
        want, spread = _expected(exercise, inputs)
        worst = {k: max(worst.get(k, 0.0), v) for k, v in spread.items()}
        try:
            got_value, written = _run(exercise, fn, inputs)
        except Exception as error:  # noqa: BLE001 - the learner's code: say what it raised, keep the notebook running
            return Result(
                exercise.name, False,
                f"{where}, your function raised {type(error).__name__}: {error} {_your_line(error)}",
            )  # fmt: skip
        got = _as_array(got_value)
        if got is None:
            return Result(exercise.name, False, f"{where}, expected an array, got {type(got_value).__name__}")
        if _matches(exercise, got, written, want):
            continue
        mistake = _matching_mistake(exercise, inputs, got, written)
        if not _same(got, want[0], exercise.tolerance):
            message = f"{where}, {_problem(exercise, inputs, got, want[0])}."
        else:  # the answer is right; an argument the task writes into is not
            name = next(
                n for n in exercise.writes if not _matches(exercise, got, {n: written[n]}, (want[0], {n: want[1][n]}))
            )
            after = _as_array(written[name])
            problem = (
                f"it is not an array but {type(written[name]).__name__}" if after is None
                else _problem(exercise, inputs, after, want[1][name])
            )  # fmt: skip
            message = (
                f"{where}, your function returned the right answer, but the task also asks it to write into "
                f"{name}, and after the call {name} is not what it should hold: {problem}."
            )
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
