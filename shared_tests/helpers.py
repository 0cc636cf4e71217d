"""The helpers more than one test module uses (a test module imports no other test module:
``shared_tests/repository/test_suite_layout.py`` holds that). The cases themselves are in
``cases.py``, the tolerances and the records of the worst errors in ``tolerances.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from transformer_backends import get_backend
from transformer_backends.tolerances import max_relative_difference, tolerance
from transformer_run.batches import decoder_only_batch, encoder_decoder_batch, split_batch
from transformer_spec import Config, init_params, param_schema, parent_of
from transformer_spec.config import ACTIVATIONS, KINDS, NORMS, POSITIONAL, ROPE_LAYOUTS, SINUSOID_LAYOUTS

from . import tolerances
from .cases import token_ids
from .tolerances import assert_matches_finite_differences


# ------------------------------------------------------------------ what a test needs installed
def needs(*backends: str) -> None:
    """Skip the running test, naming what is missing, unless every backend named is installed: a
    test that runs another backend than its own (a command line with --backend torch, a child
    process) skips in a session that installs only one framework, as the ``backend`` fixture does."""
    for name in backends:
        try:
            get_backend(name)
        except ImportError as error:
            pytest.skip(f"needs the {name} backend: {error.name} is not installed (the [{name}] extra)")


# ------------------------------------------------------------------ what `transformer-ref compare` printed
def solutions(stem: str):
    """The course's shipped answers to chapter ``stem`` (``notebooks/solutions/<stem>.py``), as a module."""
    import importlib.util

    from transformer_course.build import NOTEBOOKS

    spec = importlib.util.spec_from_file_location(f"solutions_{stem}", NOTEBOOKS / "solutions" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_compare_rows_within_tolerance(out: str) -> None:
    """``compare``'s table, as printed: a row for each installed backend and dtype, its error
    relative to the reference's largest value (the fourth column) within that dtype's tolerance."""
    from transformer_backends import available_backends

    for name in available_backends():
        for dtype in ("float64", "float32"):
            row = next((line.split() for line in out.splitlines() if line.split()[:2] == [name, dtype]), None)
            assert row is not None, f"no {name} {dtype} row in:\n{out}"
            assert float(row[3]) <= tolerance(dtype), f"{name} {dtype}: {row[3]} relative to the reference"


# ------------------------------------------------------------------ finite-difference helpers
STEP = 1e-6  # float64 central differences: truncation ~STEP^2, rounding ~1e-16 |f| / STEP


def central_difference(loss, array: np.ndarray, index: tuple) -> float:
    """d loss / d array[index], by perturbing that one entry in place (and restoring it)."""
    original = array[index]
    array[index] = original + STEP
    plus = loss()
    array[index] = original - STEP
    minus = loss()
    array[index] = original
    return (plus - minus) / (2 * STEP)


def coordinates(grad: np.ndarray, rng: np.random.Generator, full_up_to: int, samples: int) -> list[tuple]:
    """Every coordinate of a small tensor; otherwise its largest gradient, a few random entries
    among those with a gradient (an embedding table's unused rows have none) and one anywhere."""
    if grad.size <= full_up_to:
        return list(np.ndindex(grad.shape))
    picks = [np.unravel_index(np.abs(grad).argmax(), grad.shape)]
    nonzero = np.argwhere(grad != 0)
    for i in rng.choice(len(nonzero), size=min(samples, len(nonzero)), replace=False):
        picks.append(tuple(nonzero[i]))
    picks.append(tuple(int(rng.integers(0, size)) for size in grad.shape))
    return picks


def check_finite_differences(
    what: str, loss, arrays: dict, analytic: dict, full_up_to: int = 40, samples: int = 3
) -> float:
    """``arrays``: name -> an array ``loss()`` reads (perturbed in place); ``analytic``: name -> its gradient."""
    assert analytic.keys() == arrays.keys(), f"{what}: gradients for {sorted(analytic)}, expected {sorted(arrays)}"
    rng = np.random.default_rng(0)
    worst = 0.0
    for name, array in arrays.items():
        grad = analytic[name]
        assert grad.shape == array.shape and grad.dtype == array.dtype, f"{what}: {name}"
        picks = coordinates(grad, rng, full_up_to, samples)
        numeric = [central_difference(loss, array, index) for index in picks]
        at = tuple(np.array(picks).T)
        error = assert_matches_finite_differences(grad[at], numeric, float(np.abs(grad).max()), f"{what}: {name}")
        worst = max(worst, error)
    return worst


def output_weights(shape: tuple, seed: int = 7) -> np.ndarray:
    """R in loss = sum(output * R), scaled so that the loss is O(1) (finite differences lose
    digits in proportion to |loss|)."""
    return np.random.default_rng(seed).standard_normal(shape) / math.sqrt(np.prod(shape))


def module_arrays(module, component: str, config: Config) -> dict[str, np.ndarray]:
    """The module's own parameter arrays, by canonical name (perturbing them changes the module)."""
    return {name: getattr(*parent_of(module, name)) for name in param_schema(config, component)}


def build(reference, class_name: str, config: Config):
    schema = getattr(reference.impl, class_name).schema
    params = init_params(config, seed=3, dtype="float64", component=schema, nonzero_biases=True)
    return reference.build(class_name, config, params), schema


def training_batch(config: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """A padded batch: 3 sequences of unequal real lengths (see cases.token_ids)."""
    if config.kind == "decoder_only":
        return decoder_only_batch(token_ids(config.tgt_vocab_size, 3, 12, pad=True, seed=seed))  # (3, 11) each
    src = token_ids(config.src_vocab_size, 3, 11, pad=True, seed=seed + 2)
    return encoder_decoder_batch(src, token_ids(config.tgt_vocab_size, 3, 8, pad=True, seed=seed + 1))


def check_model_against_finite_differences(reference, config: Config, batch: dict, label_smoothing: float) -> None:
    model = reference.impl.build_model(config, init_params(config, seed=11, dtype="float64", nonzero_biases=True))
    _, grads = reference.impl.loss_and_grads(model, batch, label_smoothing)
    assert list(grads) == list(param_schema(config))
    inputs, targets = split_batch(config, batch)
    loss = lambda: float(reference.impl.cross_entropy(model(*inputs).logits, targets, config.pad_id, label_smoothing))
    arrays = {name: getattr(*parent_of(model, name)) for name in grads}
    check_finite_differences(f"{config.kind} model", loss, arrays, grads, full_up_to=0, samples=2)


# ------------------------------------------------------------------ a component in a backend and in the reference
def run_component(backend, reference, class_name, config, dtype, *args, component=None, **kwargs):
    """Build ``class_name`` from the same seeded weights in ``backend`` (at ``dtype``) and in the
    float64 reference; call both on the same inputs; return (got, want) as NumPy."""
    schema_name = component or getattr(reference.impl, class_name).schema
    params = init_params(config, seed=3, dtype="float64", component=schema_name, nonzero_biases=True)
    want = reference.call(reference.build(class_name, config, params), *args, **kwargs)
    cast = {k: v.astype(dtype) for k, v in params.items()}
    args = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    got = backend.call(backend.build(class_name, config, cast), *args, **kwargs)
    return got, want


# ------------------------------------------------------------------ batches
def padded_batch(config: Config) -> dict[str, np.ndarray]:
    """8 rows, 8 positions, right-padded to lengths 8 8 7 5 3 2 2 1: uneven pad counts per shard."""
    rng = np.random.default_rng(0)
    ids = np.full((8, 9), config.pad_id, np.int64)
    for row, length in enumerate([8, 8, 7, 5, 3, 2, 2, 1]):
        ids[row, : length + 1] = rng.integers(4, config.tgt_vocab_size, length + 1)
    return {"ids": ids[:, :-1], "targets": ids[:, 1:]}


# ------------------------------------------------------------------ the command line
def one_line_error(capsys, argv: list[str], *words: str) -> str:
    """Run ``transformer-ref argv``: it must exit with status 2 and print one line naming ``words``."""
    from transformer_cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2, f"exit status {exit_info.value.code}"
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"transformer-ref {argv[0]}: error: "), lines[0]
    for word in words:
        assert word in lines[0], f"{lines[0]!r} does not name {word!r}"
    return lines[0]


# ============================================================ random cases, drawn by hypothesis
# Random cases, drawn by hypothesis: every backend gives NumPy's numbers, or NumPy's exact error.
#
# The hand-picked cases of the models, inputs and errors tests cross a few switches each; the
# tests that use these strategies (test_random_... and two more) draw the whole space at once --
# model kind, sizes (heads dividing d_model, key/value heads dividing the heads, odd d_ff), one
# or two layers, every norm, activation, positional encoding (both rotary and both sinusoid layouts), bias switches, tied
# outputs, final norms, float32 and float64, batches with right-, left- and fully padded rows --
# and checks each backend against the NumPy float64 reference:
#
# * a model's logits (or an encoder's hidden states and pooler) at the real, non-pad positions,
#   within the tolerance table (``transformer_backends.tolerances.tolerance(dtype, layers)``);
# * a standalone attention (MultiHeadAttention, grouped or rotary, and
#   scaled_dot_product_attention) under random boolean masks that broadcast along any axis and
#   leave some queries nothing to attend to: its output and its weights;
# * bad inputs (ids of the wrong rank, out of range, float or bool; ragged lists; too long or
#   empty; masks of the wrong shape or dtype; token types; a component's wrong sizes and mixed
#   dtypes; weights of another config): the reference's exception, and the same type and
#   message in the backend -- or, where the reference accepts the input, its numbers.
#
# Every draw is small and comes from a few fixed sizes: JAX compiles once per model and shape,
# and that compile is most of those tests' time. ``derandomize=True``: the same examples in every
# run (CI is deterministic); a failure prints the example, which a test in another file may pin.
DRAWN_DTYPES = ("float32", "float64")
BATCHES = (1, 2, 3)
LENGTHS = (1, 4, 7)  # every sequence length a drawn model sees: few shapes, few JAX compiles
MAX_LENS = (7, 9)  # 7: the longest sequence fills every position


def hypothesis_settings(max_examples: int):
    """Deterministic (derandomize), no example database on disk, no deadline (JAX's first call
    of each new model compiles it); the fixtures are session-wide but for conftest's bookkeeping."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# strategies
@st.composite
def configs(draw, kinds=KINDS) -> Config:
    """A small valid Config: every switch drawn, sizes from a few odd values."""
    kind = draw(st.sampled_from(kinds))
    positional = draw(st.sampled_from(POSITIONAL))
    num_heads = draw(st.sampled_from((1, 2, 4, 6)))  # 4 and 6: groups of 2 or 3 over 2 or 3 kv heads
    d_k = draw(st.sampled_from((2, 4, 6) if positional == "rotary" else (2, 3, 4, 5)))  # rotary rotates pairs
    num_kv_heads = draw(st.sampled_from([None] + [n for n in range(1, num_heads + 1) if num_heads % n == 0]))
    encoder_layers = draw(st.sampled_from((1, 2))) if kind != "decoder_only" else 0
    decoder_layers = draw(st.sampled_from((1, 2))) if kind != "encoder_only" else 0
    uses_decoder = kind != "encoder_only"
    src_vocab, tgt_vocab = draw(st.sampled_from((11, 23))), draw(st.sampled_from((13, 19)))
    share_embeddings = kind == "encoder_decoder" and draw(st.booleans())  # one table: one vocabulary
    tgt_vocab = src_vocab if share_embeddings else tgt_vocab
    optional_bool = st.sampled_from((None, False, True))
    return Config(
        kind=kind,
        d_model=num_heads * d_k,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        d_ff=draw(st.sampled_from((5, 9, 13))),
        num_encoder_layers=encoder_layers,
        num_decoder_layers=decoder_layers,
        src_vocab_size=src_vocab,
        tgt_vocab_size=tgt_vocab,
        max_len=draw(st.sampled_from(MAX_LENS)),
        pad_id=draw(st.sampled_from((0, 1, 10))),  # inside both vocabularies
        norm=draw(st.sampled_from(NORMS)),
        norm_first=draw(st.booleans()),
        layer_norm_eps=draw(st.sampled_from((1e-5, 1e-12))),
        gated_ffn=draw(st.booleans()),
        activation=draw(st.sampled_from(ACTIVATIONS)),
        positional=positional,
        rope_layout=draw(st.sampled_from(ROPE_LAYOUTS)),
        rope_theta=draw(st.sampled_from((10000.0, 500.0))),
        sinusoid_layout=draw(st.sampled_from(SINUSOID_LAYOUTS)),
        bias=draw(st.booleans()),
        attention_bias=draw(optional_bool),
        ffn_bias=draw(optional_bool),
        encoder_final_norm=draw(optional_bool),
        decoder_final_norm=draw(optional_bool),
        scale_embeddings=draw(st.booleans()),
        tie_output=draw(st.booleans()) if uses_decoder else False,
        final_logits_bias=draw(st.booleans()) if uses_decoder else False,
        type_vocab_size=draw(st.sampled_from((0, 2, 3))) if kind == "encoder_only" else 0,
        embedding_norm=draw(st.booleans()),
        pooler=draw(st.booleans()) if kind == "encoder_only" else False,
        dropout=draw(st.sampled_from((0.0, 0.1))),  # inference: no backend may drop anything
        share_embeddings=share_embeddings,
    )


@st.composite
def padded_ids(draw, vocab_size: int, pad_id: int, batch: int, seq_len: int) -> np.ndarray:
    """(batch, seq_len) ids, each row unpadded, right-padded, left-padded or all padding; the
    real tokens are never pad_id, so ``ids != pad_id`` marks exactly the real positions."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    ids = rng.integers(0, vocab_size - 1, size=(batch, seq_len))
    ids += ids >= pad_id  # skip pad_id
    for row in range(batch):
        padding = draw(st.sampled_from(("none", "right", "left", "full")))
        real = draw(st.integers(1, seq_len))
        if padding == "right":
            ids[row, real:] = pad_id
        elif padding == "left":
            ids[row, : seq_len - real] = pad_id
        elif padding == "full":
            ids[row] = pad_id
    return ids


def _vocab(config: Config) -> int:
    """The vocabulary of a model's main ids: the target's for a decoder-only model."""
    return config.tgt_vocab_size if config.kind == "decoder_only" else config.src_vocab_size


@st.composite
def model_cases(draw) -> tuple[Config, str, tuple, dict]:
    """(config, dtype, positional inputs, keyword inputs) of one model call."""
    config = draw(configs())
    batch = draw(st.sampled_from(BATCHES))
    ids = draw(padded_ids(_vocab(config), config.pad_id, batch, draw(st.sampled_from(LENGTHS))))
    inputs, kwargs = (ids,), {}
    if config.kind == "encoder_decoder":
        tgt = draw(padded_ids(config.tgt_vocab_size, config.pad_id, batch, draw(st.sampled_from(LENGTHS))))
        inputs = (ids, tgt)
    if config.type_vocab_size and draw(st.booleans()):
        kwargs["token_type_ids"] = np.random.default_rng(3).integers(0, config.type_vocab_size, ids.shape)
    return config, draw(st.sampled_from(DRAWN_DTYPES)), inputs, kwargs


def real_positions(config: Config, inputs: tuple) -> np.ndarray:
    """(B, T) True where the output row belongs to a real token: the target's for a decoder."""
    return inputs[-1] != config.pad_id


def layer_count(config: Config) -> int:
    return config.num_encoder_layers + config.num_decoder_layers


def check_close(got, want, dtype: str, layers: int, what: str) -> None:
    """``assert_close`` with the bound of a stack of ``layers`` layers, recorded as the suite's are."""
    error = max_relative_difference(got, want)
    tol = tolerance(dtype, max(layers, 2))
    tolerances.record_parity("output", dtype, error, tol)
    key = (tolerances.current_backend["name"], tolerances.current_backend["oracle"], dtype)
    if error > tolerances.WORST.get(key, (-1.0, ""))[0]:
        tolerances.WORST[key] = (error, f"{tolerances.current_backend['test']}: {what}")
    assert error <= tol, f"{what}: max |diff| / max |reference| = {error:.3e} > {tol:.0e} ({dtype})"


def cast_params(params: dict, dtype: str) -> dict:
    return {name: value.astype(dtype) for name, value in params.items()}



# attention
@st.composite
def masks(draw, shape: tuple[int, ...]) -> np.ndarray | None:
    """None, or a boolean mask broadcastable to ``shape`` (each axis full or 1), True with a drawn
    probability: some query rows may have no key to attend to."""
    if draw(st.booleans()) and draw(st.booleans()):
        return None
    mask_shape = tuple(n if draw(st.booleans()) else 1 for n in shape)
    p = draw(st.sampled_from((0.2, 0.6, 1.0)))
    mask = np.random.default_rng(draw(st.integers(0, 2**16))).random(mask_shape) < p
    if draw(st.booleans()):  # a query that may look at nothing
        mask[..., draw(st.integers(0, mask_shape[-2] - 1)), :] = False
    return mask


@st.composite
def attention_cases(draw):
    config = draw(configs(kinds=("encoder_decoder",)))
    batch, t_q = draw(st.sampled_from(BATCHES)), draw(st.sampled_from(LENGTHS))
    t_k = draw(st.sampled_from(LENGTHS))  # rotary too: queries at 0 .. T_q - 1, keys at 0 .. T_k - 1
    mask = draw(masks((batch, config.num_heads, t_q, t_k)))
    return config, draw(st.sampled_from(DRAWN_DTYPES)), batch, t_q, t_k, mask



# bad inputs
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _as_form(draw, x: np.ndarray):
    """``x`` as the backend's own array (``backend.call`` converts NumPy arrays) or as a list."""
    return x.tolist() if draw(st.booleans()) else x


def _bad_shape(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that does not broadcast to ``shape``: another rank, or one axis neither 1 nor its size."""
    if draw(st.booleans()):
        rank = draw(st.sampled_from([r for r in range(1, 6) if r != len(shape)]))
        return tuple(draw(st.sampled_from((1, 2, 5))) for _ in range(rank))
    axis = draw(st.integers(0, len(shape) - 1))
    size = draw(st.sampled_from([n for n in (2, 3, 5, 6, 8) if n != shape[axis]]))
    return shape[:axis] + (size,) + shape[axis + 1 :]


@st.composite
def bad_ids(draw, vocab_size: int, max_len: int, shape: tuple[int, int]):
    """(label, ids) ids that a model must refuse (or, where NumPy reads them, read as NumPy does)."""
    good = np.random.default_rng(draw(st.integers(0, 2**16))).integers(0, vocab_size, shape)
    fault = draw(
        st.sampled_from(("rank", "negative", "too-large", "float", "bool", "ragged", "too-long", "empty", "nested"))
    )
    if fault == "rank":
        rank_shape = draw(st.sampled_from(((), (shape[1],), (1, *shape), (*shape, 2))))
        return fault, _as_form(draw, np.ones(rank_shape, np.int64))
    if fault in ("negative", "too-large"):
        values = st.integers(-300, -1) if fault == "negative" else st.integers(vocab_size, 300)
        where = draw(st.lists(st.tuples(st.integers(0, shape[0] - 1), st.integers(0, shape[1] - 1)), min_size=1))
        ids = good.copy()
        for row, col in where:
            ids[row, col] = draw(values)
        dtypes = [t for t in INT_DTYPES if np.iinfo(t).min <= ids.min() and ids.max() <= np.iinfo(t).max]
        return fault, _as_form(draw, ids.astype(draw(st.sampled_from(dtypes))))
    if fault == "float":
        return fault, _as_form(draw, good.astype(draw(st.sampled_from(("float32", "float64")))))
    if fault == "bool":
        return fault, _as_form(draw, good % 2 == 0)
    if fault == "ragged":
        extra = draw(st.sampled_from([n for n in range(shape[1] + 3) if n != shape[1]]))
        rows = good.tolist() + [[1] * extra]
        return fault, rows if draw(st.booleans()) else tuple(tuple(r) for r in rows)
    if fault == "too-long":
        return fault, _as_form(draw, np.ones((shape[0], max_len + draw(st.integers(1, 3))), np.int64))
    if fault == "nested":  # a list holding a bare number where a row should be
        return fault, [good[0].tolist(), 1]
    return fault, np.zeros((shape[0], 0), draw(st.sampled_from(("int64", "int32"))))  # empty


@st.composite
def bad_masks(draw, expected: tuple[int, ...]):
    """(label, mask) a mask of the wrong shape, dtype or nesting for scores of shape ``expected``."""
    fault = draw(st.sampled_from(("shape", "dtype", "ragged")))
    if fault == "shape":
        return fault, _as_form(draw, np.ones(_bad_shape(draw, expected), bool))
    if fault == "dtype":
        return fault, _as_form(draw, np.ones(expected, draw(st.sampled_from(("int64", "float32", "float64", "uint8")))))
    return fault, [[[[True] * (expected[3] + 1), [True]]]]


@st.composite
def bad_model_calls(draw):
    """(config, label, positional args, keyword args): one call of a model with one bad input."""
    config = draw(configs())
    batch, seq_len = draw(st.sampled_from(BATCHES)), draw(st.sampled_from(LENGTHS))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, _vocab(config), (batch, seq_len))
    what = draw(st.sampled_from(("ids", "mask", "second ids", "token types", "batch")))
    heads = config.num_heads
    if config.kind == "encoder_decoder":
        tgt_len = draw(st.sampled_from(LENGTHS))
        tgt = rng.integers(0, config.tgt_vocab_size, (batch, tgt_len))
        if what in ("ids", "second ids"):
            vocab = config.src_vocab_size if what == "ids" else config.tgt_vocab_size
            label, bad = draw(bad_ids(vocab, config.max_len, (batch, seq_len if what == "ids" else tgt_len)))
            args = (bad, tgt) if what == "ids" else (ids, bad)
            return config, f"{what}: {label}", args, {}
        if what == "batch":  # source and target of different batch sizes
            return config, what, (ids, rng.integers(0, config.tgt_vocab_size, (batch + 1, tgt_len))), {}
        name = draw(st.sampled_from(("src_mask", "tgt_mask", "memory_mask")))
        t_q = seq_len if name == "src_mask" else tgt_len  # the encoder's queries, or the decoder's
        t_k = tgt_len if name == "tgt_mask" else seq_len  # the decoder's keys, or the encoder's
        label, mask = draw(bad_masks((batch, heads, t_q, t_k)))
        return config, f"{name}: {label}", (ids, tgt), {name: mask}
    if what in ("ids", "second ids", "batch"):
        label, bad = draw(bad_ids(_vocab(config), config.max_len, (batch, seq_len)))
        return config, f"ids: {label}", (bad,), {}
    if what == "token types" and config.kind == "encoder_only":
        fault = draw(st.sampled_from(("range", "shape", "bool", "float")))
        types = rng.integers(0, max(config.type_vocab_size, 1), (batch, seq_len))
        if fault == "range":
            types[draw(st.integers(0, batch - 1)), -1] = draw(st.sampled_from((-1, config.type_vocab_size, 7)))
        elif fault == "shape":
            types = np.zeros(_bad_shape(draw, (batch, seq_len)), np.int64)
        else:
            types = types.astype(bool if fault == "bool" else "float64")
        return config, f"token types: {fault}", (ids,), {"token_type_ids": _as_form(draw, types)}
    label, mask = draw(bad_masks((batch, heads, seq_len, seq_len)))
    return config, f"mask: {label}", (ids,), {"mask": mask}


def _first_output(output) -> np.ndarray:
    """A model's logits (or an encoder's last hidden state), an attention's output, a layer's output."""
    if isinstance(output, tuple):
        return output[0]
    if hasattr(output, "logits"):
        return output.logits if output.logits is not None else output.last_hidden_state
    return output


def same_outcome(backend, reference, call, what: str, dtype: str = "float64", layers: int = 2) -> None:
    """``call(b)`` in the reference and in ``backend``: the same exception type and message, or
    (where the reference accepts the input) the same numbers."""
    try:
        want = call(reference)
    except (TypeError, ValueError) as error:
        expected = error
        event(f"refused: {type(error).__name__}")  # pytest --hypothesis-show-statistics counts them
    else:
        event(f"accepted: {what.split(' into ')[0]}")
        check_close(_first_output(call(backend)), _first_output(want), dtype, layers, f"{what}, accepted by the reference")
        return
    with pytest.raises(type(expected)) as raised:
        call(backend)
    assert type(raised.value) is type(expected), f"{what}: {raised.value!r} where the reference raised {expected!r}"
    assert str(raised.value) == str(expected), f"{what}: {raised.value!r} where the reference raised {expected!r}"



@st.composite
def bad_component_calls(draw):
    """(config, component class, label, args): an attention, a norm or a feed-forward with one bad input."""
    config = draw(configs(kinds=("encoder_decoder",)))
    batch, t_q, t_k = draw(st.sampled_from(BATCHES)), draw(st.sampled_from(LENGTHS)), draw(st.sampled_from(LENGTHS))
    d = config.d_model
    rng = np.random.default_rng(0)
    fault = draw(st.sampled_from(("d_model", "batch", "rank", "mixed dtypes", "weights dtype", "int", "mask")))
    dtypes = ["float64"] * 3
    shapes = [(batch, t_q, d), (batch, t_k, d), (batch, t_k, d)]
    which = draw(st.integers(0, 2))
    mask = None
    if fault == "d_model":
        shapes[which] = (*shapes[which][:2], d + draw(st.sampled_from((-1, 1, 2))))
    elif fault == "batch":
        shapes[which] = (batch + 1, *shapes[which][1:])
    elif fault == "rank":
        shapes[which] = shapes[which][1:] if draw(st.booleans()) else (1, *shapes[which])
    elif fault == "mixed dtypes":
        dtypes[which] = draw(st.sampled_from(("float32", "float16")))
    elif fault == "weights dtype":
        dtypes = ["float32"] * 3
    elif fault == "int":
        dtypes[which] = draw(st.sampled_from(("int64", "int32")))
    else:
        mask = draw(bad_masks((batch, config.num_heads, t_q, t_k)))[1]
    arrays = [(rng.standard_normal(s) * 3).astype(t) for s, t in zip(shapes, dtypes, strict=True)]
    component = draw(st.sampled_from(("MultiHeadAttention", "norm", "feed_forward")))
    if component == "MultiHeadAttention":
        return config, component, "attention", f"attention: {fault}", (*arrays, mask)
    if config.norm == "rms_norm":
        name, schema = ("RMSNorm", "rms_norm") if component == "norm" else ("GatedFeedForward", "gated_feed_forward")
    else:
        name, schema = (
            ("LayerNorm", "layer_norm") if component == "norm" else ("PositionwiseFeedForward", "feed_forward")
        )
    return config, name, schema, f"{name}: {fault}", (arrays[which],)



