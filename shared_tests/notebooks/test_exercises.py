"""The course's exercises: every solution passes its checker; every known wrong answer fails it,
with a message naming that mistake; a wrong answer nobody listed gets the first differing element."""

from __future__ import annotations

import copy
import inspect
import re

import numpy as np
import pytest

from transformer_course import Exercise, Mistake, check, check_exercise
from transformer_course.build import NOTEBOOKS, chapters
from transformer_course.exercises import EXERCISES, chapter
from transformer_course.exercises.parts import Part

from ..helpers import solutions

SOLUTIONS = NOTEBOOKS / "solutions"


def test_every_chapter_has_a_notebook_and_a_solutions_file_and_every_solution_an_exercise():
    stems = [p.stem for p in chapters()]
    assert {e.chapter for e in EXERCISES.values()} <= set(stems)
    for stem in {e.chapter for e in EXERCISES.values()}:
        names = {e.name for e in chapter(stem)}
        module = solutions(stem)
        written = {n for n in vars(module) if callable(getattr(module, n)) and not n.startswith("_")}
        assert names <= written, f"solutions/{stem}.py lacks {sorted(names - written)}"
        source = (NOTEBOOKS / f"{stem}.py").read_text()
        for name in names:  # the notebook asks for each of its exercises
            assert f"check({name})" in source, f"{stem}.py never checks {name}"


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_solution_passes(name):
    exercise = EXERCISES[name]
    result = check(getattr(solutions(exercise.chapter), name))
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
    assert check_exercise(exercise, lambda x: x.sum() + 1).message.endswith(
        "expected 15.0, got 16.0 (1 more than expected, 6.67% of it)."
    )


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


# ---------------------------------------------------------------- every exercise can tell a wrong answer
def _signature(exercise: Exercise) -> list[str]:
    """The arguments the task names: ``name(a, b, c) -> ...``."""
    match = re.match(rf"{exercise.name}\(([^)]*)\)", exercise.task)
    assert match, f"{exercise.name}'s task does not start with its signature: {exercise.task[:60]!r}"
    return [argument.strip() for argument in match.group(1).split(",") if argument.strip()]


def _key(value):
    """A value made comparable: arrays by shape, dtype and bytes; containers item by item; else repr."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, list | tuple):
        return ("sequence", tuple(_key(v) for v in value))
    if isinstance(value, Part):
        return ("part", value.class_name, _key(value.params))
    return ("value", repr(value))


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_argument_the_task_names_takes_two_values_across_the_cases(name):
    """An argument that holds one value in every case cannot catch an answer that writes that value
    in (a pad id of 0, torch's default betas, a sub-layer called by name)."""
    exercise = EXERCISES[name]
    cases = exercise.cases()
    arguments = _signature(exercise)
    for description, inputs in cases:
        assert list(inputs) == arguments, f"{description}: the case gives {list(inputs)}, the task {arguments}"
    constant = [a for a in arguments if len({_key(inputs[a]) for _, inputs in cases}) < 2]
    assert not constant, f"{name}: {constant} hold one value in all {len(cases)} cases"


def _changed(value):
    """The same value, wrong in one element (a bool flipped; a number moved by 1 and by 1% of itself)."""
    array = np.array(value, copy=True)
    flat = array.reshape(-1)
    if array.dtype == bool:
        flat[-1] = not flat[-1]
    else:
        flat[-1] = flat[-1] + 1 + abs(flat[-1]) / 100 if np.isfinite(flat[-1]) else 0
    return array


def _outputs_of(exercise: Exercise, solution):
    """The solution's answer on the first case, and the number of outputs it is made of (a tuple's length)."""
    _, inputs = exercise.cases()[0]
    value = solution(**copy.deepcopy(inputs))
    return value, (len(value) if isinstance(value, tuple) else 1)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_output_the_task_asks_for_is_compared(name):
    """Each output of the answer, one element changed, is refused: each array of a tuple (Adam's param,
    m and v); and an argument the task writes into, left as it came (a cache step computed on copies)."""
    exercise = EXERCISES[name]
    solution = getattr(solutions(exercise.chapter), name)
    _, count = _outputs_of(exercise, solution)
    for which in range(count):

        def one_output_wrong(*args, which=which, **kwargs):
            value = solution(*args, **kwargs)
            if count == 1:
                return _changed(value)
            return tuple(_changed(v) if i == which else v for i, v in enumerate(value))

        result = check_exercise(exercise, one_output_wrong)
        assert not result.ok, f"{name}: output {which} of {count} changed, yet {result}"
    words = re.findall(r"\bwrite\b[^.:;]*\binto\b|\bin place\b", exercise.task)  # "write ... into slot"
    assert bool(words) == bool(exercise.writes), f"{name}: the task says {words}, the checker compares {exercise.writes}"
    for argument in exercise.writes:

        def on_a_copy(argument=argument, **kwargs):
            kwargs[argument] = np.array(kwargs[argument], copy=True)  # the caller's buffer is never written
            return solution(**kwargs)

        result = check_exercise(exercise, on_a_copy)
        assert not result.ok and f"write into {argument}" in result.message, result.message


def _parts_in(value):
    if isinstance(value, Part):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _parts_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _parts_in(item)


def test_every_part_handed_to_a_learner_is_called_as_its_real_module_is():
    """The sub-layers, norms and layers an exercise hands over accept what the real module accepts,
    keyword arguments included: an attention called (y, y, y, mask=mask) gives what (y, y, y, mask) gives."""
    kinds = set()
    for exercise in EXERCISES.values():
        for _, inputs in exercise.cases():
            for part in _parts_in(inputs):
                kinds.add(part.class_name)
                accepted = inspect.signature(type(part.module).__call__).parameters
                given = inspect.signature(part.__call__).parameters
                assert any(p.kind is p.VAR_KEYWORD for p in given.values()), part
                assert set(accepted) - {"self"}, part  # the real module's arguments, passed through by name
    assert {"MultiHeadAttention", "LayerNorm", "EncoderLayer", "PositionwiseFeedForward"} <= kinds, kinds
    exercise = EXERCISES["encoder_layer"]
    _, inputs = exercise.cases()[0]
    attention, x, mask = inputs["parts"]["self_attn"], inputs["x"], inputs["mask"]
    np.testing.assert_array_equal(attention(x, x, x, mask=mask), attention(x, x, x, mask))
    np.testing.assert_array_equal(attention(query=x, key=x, value=x, mask=mask), attention(x, x, x, mask))


def test_an_encoder_layer_that_passes_the_mask_by_keyword_is_right():
    def encoder_layer(x, mask, parts, norm_first):
        def attend(y):
            return parts["self_attn"](y, y, y, mask=mask)  # as the real MultiHeadAttention is called

        if norm_first:
            x = x + attend(parts["self_attn_norm"](x))
            return x + parts["ffn"](parts["ffn_norm"](x))
        x = parts["self_attn_norm"](x + attend(x))
        return parts["ffn_norm"](x + parts["ffn"](x))

    result = check(encoder_layer)
    assert result.ok, result.message


def test_an_error_inside_numpy_is_reported_at_the_learners_own_line():
    """The innermost frame of an error raised by np.stack is in NumPy; the learner's cell has no such
    line: the message gives the line of the learner's code that called it, with its text."""

    def causal_mask(seq_len):
        rows = [np.arange(seq_len) <= i for i in range(seq_len)]
        return np.stack(rows[:-1] + [rows[-1][:-1]])[None, None]  # the last row one short

    result = check(causal_mask)
    line = inspect.getsourcelines(causal_mask)[1] + 2
    assert not result.ok and "raised ValueError" in result.message, result.message
    assert f"(line {line} of your code: return np.stack(rows[:-1] + [rows[-1][:-1]])[None, None]" in result.message
    assert ", inside " in result.message and "numpy" not in result.message.split("(line")[1], result.message


def test_a_wrong_count_names_the_parts_it_left_out_and_a_wrong_loss_says_by_how_much():
    from transformer_course.exercises.ch10_models import _count

    no_final_norm = check(lambda config: _count(config, no_final_norm=True), "count_parameters")
    assert "72 less than expected: exactly the final norms (72), left out" in no_final_norm.message, no_final_norm
    no_bias = check(lambda config: _count(config, no_bias=True), "count_parameters")
    assert "exactly the self-attention biases (576) + the feed-forward biases (292)" in no_bias.message, no_bias

    def cross_entropy_loss(logits, targets, pad_id):
        return solutions("11_loss").cross_entropy_loss(logits, targets, pad_id) * 1.1

    result = check(cross_entropy_loss)
    assert re.search(r"expected 5\.35\d+, got 5\.88\d+ \(0\.535\d+ more than expected, 10\.00% of it\)", result.message)


def test_a_cache_step_that_never_writes_its_buffers_is_refused_naming_the_buffer():
    from transformer_course.exercises.ch14_decoding import _on_copies

    result = check(_on_copies, "kv_cache_step")
    assert not result.ok and result.mistake == "the buffers never written", result
    assert "returned the right answer, but the task also asks it to write into k_cache" in result.message
    assert "the first differing element is [0, 0, 3, 0]" in result.message  # slot `position` of case 1
