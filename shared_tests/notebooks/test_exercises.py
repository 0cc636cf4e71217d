"""The course's exercises: every solution passes its checker; every known wrong answer fails it,
with a message naming that mistake; a wrong answer nobody listed gets the first differing element."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from transformer_course import Exercise, Mistake, check, check_exercise
from transformer_course.build import NOTEBOOKS, chapters
from transformer_course.exercises import EXERCISES, chapter

SOLUTIONS = NOTEBOOKS / "solutions"


def _solutions(stem: str):
    path = SOLUTIONS / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"solutions_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_chapter_has_a_notebook_and_a_solutions_file_and_every_solution_an_exercise():
    stems = [p.stem for p in chapters()]
    assert {e.chapter for e in EXERCISES.values()} <= set(stems)
    for stem in {e.chapter for e in EXERCISES.values()}:
        names = {e.name for e in chapter(stem)}
        module = _solutions(stem)
        written = {n for n in vars(module) if callable(getattr(module, n)) and not n.startswith("_")}
        assert names <= written, f"solutions/{stem}.py lacks {sorted(names - written)}"
        source = (NOTEBOOKS / f"{stem}.py").read_text()
        for name in names:  # the notebook asks for each of its exercises
            assert f"check({name})" in source, f"{stem}.py never checks {name}"


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_solution_passes(name):
    exercise = EXERCISES[name]
    result = check(getattr(_solutions(exercise.chapter), name))
    assert result.ok, str(result)


@pytest.mark.parametrize(
    "name, mistake",
    [(name, m.name) for name, e in sorted(EXERCISES.items()) for m in e.mistakes],
)
def test_a_known_mistake_fails_with_its_name(name, mistake):
    exercise = EXERCISES[name]
    wrong = next(m for m in exercise.mistakes if m.name == mistake)
    result = check_exercise(exercise, wrong.answer)
    assert not result.ok
    assert result.mistake == mistake, str(result)
    assert f"classic mistake: {mistake}." in result.message


def test_every_exercise_has_a_known_mistake():
    assert all(e.mistakes for e in EXERCISES.values()), [e.name for e in EXERCISES.values() if not e.mistakes]


def _scale_exercise(mistakes=()) -> Exercise:
    return Exercise(
        name="double",
        chapter="01_masks",
        task="double(x) -> 2 x",
        cases=lambda: [("a 2 x 3 matrix", {"x": np.arange(6.0).reshape(2, 3)})],
        expected=lambda b, x: b.to_numpy(b.asarray(x["x"]) * 2),
        mistakes=mistakes,
    )


def test_an_unlisted_wrong_answer_gets_the_first_differing_element_and_no_mistake_name():
    result = check_exercise(_scale_exercise(), lambda x: np.where(x == 4.0, 0.0, 2 * x))
    assert not result.ok and result.mistake is None
    assert "[1, 1]: expected 8.0, got 0.0 (1 of 6 elements differ)" in result.message


def test_shape_dtype_exceptions_and_non_arrays_are_reported_not_raised():
    exercise = _scale_exercise((Mistake("the transpose", "no transpose", lambda x: (2 * x).T),))
    result = check_exercise(exercise, lambda x: (2 * x).T)
    assert "expected shape (2, 3), got (3, 2)" in result.message and result.mistake == "the transpose"
    assert "raised ZeroDivisionError: division by zero" in check_exercise(exercise, lambda x: 1 / 0).message
    assert "expected an array, got NoneType" in check_exercise(exercise, lambda x: None).message
    assert "expected dtype float64, got bool" in check_exercise(exercise, lambda x: x > 0).message
    assert "NaN" not in str(check_exercise(exercise, lambda x: 2 * x))


def test_a_mask_answered_as_0_and_1_floats_is_refused_naming_the_dtype():
    """A boolean answer is compared by dtype as well as by value: a float 0/1 mask holds the right
    values but is not a mask (``scores[~mask]`` would index, not select)."""
    right = check_exercise(EXERCISES["padding_mask"], lambda ids, pad_id: (ids != pad_id)[:, None, None, :])
    assert right.ok, right.message
    result = check_exercise(
        EXERCISES["padding_mask"], lambda ids, pad_id: (ids != pad_id)[:, None, None, :].astype(np.float64)
    )
    assert not result.ok and "expected dtype bool, got float64" in result.message, result.message


def test_infinities_and_nans_count_as_equal_where_they_sit_in_the_same_places():
    exercise = Exercise(
        name="reciprocal",
        chapter="01_masks",
        task="reciprocal(x) -> 1 / x, inf at 0",
        cases=lambda: [("zeros of both signs, a NaN", {"x": np.array([0.0, -0.0, 2.0, np.nan])})],
        expected=lambda b, x: b.to_numpy(1 / b.asarray(x["x"])),
    )
    with np.errstate(divide="ignore"):
        assert check_exercise(exercise, lambda x: 1 / x).ok
        assert not check_exercise(exercise, lambda x: 1 / np.abs(x)).ok  # -inf against inf
        assert not check_exercise(exercise, lambda x: np.nan_to_num(1 / x)).ok


def test_a_wrong_number_is_reported_as_expected_and_got():
    exercise = Exercise(
        name="total",
        chapter="01_masks",
        task="total(x) -> the sum of x",
        cases=lambda: [("six numbers", {"x": np.arange(6.0)})],
        expected=lambda b, x: b.to_numpy(b.asarray(x["x"]).sum()),
    )
    assert check_exercise(exercise, lambda x: x.sum() + 1).message.endswith("expected 15.0, got 16.0.")


def test_check_refuses_a_function_no_exercise_is_named_after():
    def not_an_exercise(x):
        return x

    with pytest.raises(KeyError, match="no exercise named 'not_an_exercise'; expected one of"):
        check(not_an_exercise)


def test_an_answer_that_writes_into_its_inputs_changes_no_later_case_or_backend():
    def double_in_place(x):
        x *= 2  # writes into the array it was given
        return x

    exercise = _scale_exercise((Mistake("in place", "unused", lambda x: x),))
    assert check_exercise(exercise, double_in_place).ok
    assert check_exercise(exercise, double_in_place).ok  # the case's own arrays are unchanged


def _windows(lines: list[str], size: int = 3) -> set[tuple[str, ...]]:
    skip = ("#", '"""', "import ", "from ")  # comments, docstrings' ends and imports are no one's code
    code = [line.strip() for line in lines if line.strip() and not line.strip().startswith(skip)]
    return {tuple(code[i : i + size]) for i in range(len(code) - size + 1)}


def test_no_chapter_pastes_a_backends_code():
    """Backend code reaches a notebook only through show(), read from the file as the cell runs:
    no three consecutive code lines of a chapter or its solutions are three lines of a backend file."""
    backend = set()
    for package in ("numpy_impl", "jax_impl", "torch_impl"):
        for path in (NOTEBOOKS.parent / package).glob("*.py"):
            backend |= _windows(path.read_text(encoding="utf-8").splitlines())
    pasted = {}
    for path in [*chapters(), *sorted(SOLUTIONS.glob("*.py"))]:
        found = _windows(path.read_text(encoding="utf-8").splitlines()) & backend
        if found:
            pasted[path.name] = sorted(found)[:2]
    assert not pasted, f"chapters repeating a backend's lines instead of show()ing them: {pasted}"


def test_show_reads_each_backends_own_forward_and_refuses_a_name_a_file_lacks():
    from transformer_course import show

    shown = show("layer_norm.py", "LayerNorm.__call__")
    assert [s.name for s in shown.snippets] == ["LayerNorm.__call__", "LayerNorm.__call__", "LayerNorm.forward"]
    assert all("def __call__(" in s.text or "def forward(" in s.text for s in shown.snippets)
    assert all(s.text.startswith("@fusable") for s in shown.snippets)  # from its first decorator
    with pytest.raises(LookupError, match="numpy_impl/masks.py defines no 'make_everything'"):
        show("masks.py", "make_everything")
    with pytest.raises(FileNotFoundError, match="numpy_impl has no file 'nothing.py'"):
        show("nothing.py", "f")


def test_show_shared_reads_a_function_the_backends_share_from_its_file():
    from transformer_course import show_shared
    from transformer_run import decoding

    (snippet,) = show_shared(decoding.greedy_decode).snippets
    assert snippet.path == "transformer_run/decoding.py" and snippet.text.startswith("def greedy_decode(")
    lines = (NOTEBOOKS.parent / snippet.path).read_text(encoding="utf-8").splitlines()
    assert "\n".join(lines[snippet.start - 1 : snippet.end]) + "\n" == snippet.text
