"""Bad input raises, in every backend, the same exception with the same message as NumPy's.

Each case is a function of a backend that makes one bad call; the test runs it in the
backend and in the NumPy reference and demands the same type and the same message, and
that the message names what was expected and what came. The test_random_... tests draw bad
model and component inputs at random (hypothesis, helpers.py's strategies): where the reference
refuses one, the backend refuses it with the same message; where it accepts it, the same numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer_spec import Config, WeightsError, WeightsFileError, init_params, save_params

from ..cases import TINY, as_kind, hidden
from ..helpers import (
    DRAWN_DTYPES,
    bad_component_calls,
    bad_model_calls,
    configs,
    hypothesis_settings,
    layer_count,
    same_outcome,
)

LM = as_kind(TINY, "decoder_only")
BERT = Config.preset("tiny-bert")


def _lm(backend, config=LM):
    return backend.impl.build_model(config, init_params(config, dtype="float64"))


def _attention(backend):
    return backend.build("MultiHeadAttention", TINY, init_params(TINY, dtype="float64", component="attention"))


def _sdpa(backend, q_shape, k_shape, v_shape, mask=None):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in (q_shape, k_shape, v_shape))
    return backend.call(backend.impl.scaled_dot_product_attention, q, k, v, mask)


CASES = {
    # name: (bad call, expected exception, words the message must contain)
    "ids-float": (lambda b: b.call(_lm(b), np.ones((2, 3))), TypeError, ["integer token ids", "float64"]),
    "ids-too-large": (
        lambda b: b.call(_lm(b), np.array([[1, 2, 53, 60]])),
        ValueError,
        ["[0, 53)", "[53, 60]"],
    ),
    "ids-negative": (lambda b: b.call(_lm(b), np.array([[1, -1, 2]])), ValueError, ["[0, 53)", "[-1]"]),
    "ids-1d": (lambda b: b.call(_lm(b), np.array([1, 2, 3])), ValueError, ["(batch, seq_len)", "(3)"]),
    "ids-too-long": (
        lambda b: b.call(_lm(b), np.ones((1, 65), np.int64)),
        ValueError,
        ["length 65", "max_len is 64"],
    ),
    "ids-past-max_len-at-offset": (
        lambda b: b.call(
            b.build("Embeddings", TINY, init_params(TINY, dtype="float64", component="embeddings")),
            np.ones((1, 10), np.int64),
            None,
            60,
        ),
        ValueError,
        ["length 10 starting at position 60", "max_len is 64"],
    ),
    "token-types-without-type-vocab": (
        lambda b: b.call(_lm(b, as_kind(TINY, "encoder_only")), np.ones((1, 3), np.int64), np.zeros((1, 3), np.int64)),
        ValueError,
        ["type_vocab_size=0"],
    ),
    "token-types-out-of-range": (
        lambda b: b.call(_lm(b, BERT), np.ones((1, 3), np.int64), np.array([[0, 1, 2]])),
        ValueError,
        ["[0, 2)", "[2]"],
    ),
    "token-types-wrong-shape": (
        lambda b: b.call(_lm(b, BERT), np.ones((1, 3), np.int64), np.zeros((1, 4), np.int64)),
        ValueError,
        ["token_type_ids", "(1, 3)", "(1, 4)"],
    ),
    "mask-2d": (
        lambda b: b.call(_lm(b), np.ones((2, 4), np.int64), np.ones((2, 4), bool)),
        ValueError,
        ["(B, H, T_q, T_k) = (2, 3, 4, 4)", "got shape (2, 4)"],
    ),
    "mask-wrong-length": (
        lambda b: b.call(
            _attention(b), hidden(2, 3, 36), hidden(2, 5, 36), hidden(2, 5, 36), np.ones((2, 1, 1, 3), bool)
        ),
        ValueError,
        ["(2, 3, 3, 5)", "got shape (2, 1, 1, 3)"],
    ),
    "mask-float": (
        lambda b: b.call(_lm(b), np.ones((2, 4), np.int64), np.ones((2, 1, 4, 4))),
        TypeError,
        ["boolean mask", "float64"],
    ),
    "qkv-d_k-mismatch": (
        lambda b: _sdpa(b, (2, 3, 4), (2, 5, 6), (2, 5, 6)),
        ValueError,
        ["q (2, 3, 4)", "k (2, 5, 6)"],
    ),
    "qkv-length-mismatch": (lambda b: _sdpa(b, (2, 3, 4), (2, 5, 4), (2, 6, 4)), ValueError, ["v (2, 6, 4)"]),
    "query-wrong-d_model": (
        lambda b: b.call(_attention(b), hidden(2, 3, 35), hidden(2, 5, 36), hidden(2, 5, 36)),
        ValueError,
        ["d_model=36", "query (2, 3, 35)"],
    ),
    "memory-batch-mismatch": (
        lambda b: b.call(
            b.build("DecoderLayer", TINY, init_params(TINY, dtype="float64", component="decoder_layer")),
            hidden(2, 3, 36),
            hidden(3, 5, 36),
        ),
        ValueError,
        ["same batch size", "(3, 5, 36)", "(2, 3, 36)"],
    ),
    "memory-missing": (
        lambda b: b.call(
            b.build("DecoderLayer", TINY, init_params(TINY, dtype="float64", component="decoder_layer")),
            hidden(2, 3, 36),
        ),
        ValueError,
        ["needs memory"],
    ),
    "weights-missing-key": (
        lambda b: b.impl.build_model(
            LM, {k: v for k, v in init_params(LM).items() if k != "decoder.layers.1.ffn_norm.weight"}
        ),
        WeightsError,
        ["missing keys ['decoder.layers.1.ffn_norm.weight']"],
    ),
    "weights-unexpected-key": (
        lambda b: b.impl.build_model(
            LM, init_params(LM) | {"decoder.layers.9.ffn.w_1.weight": np.zeros((36, 37), "float32")}
        ),
        WeightsError,
        ["unexpected keys ['decoder.layers.9.ffn.w_1.weight']"],
    ),
    "weights-wrong-shape": (
        lambda b: b.impl.build_model(LM, init_params(LM) | {"generator.proj.weight": np.zeros((53, 36), "float32")}),
        WeightsError,
        ["generator.proj.weight: expected (36, 53), got (53, 36)"],
    ),
    "weights-mixed-dtypes": (
        lambda b: b.impl.build_model(LM, init_params(LM) | {"decoder.layers.1.ffn_norm.weight": np.ones(36)}),
        WeightsError,
        ["must all be float32 or all float64", "float64': ['decoder.layers.1.ffn_norm.weight"],
    ),
    "weights-wrong-model-kind": (
        lambda b: b.impl.Transformer(LM),
        ValueError,
        ["kind='encoder_decoder'", "kind='decoder_only'"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_the_same_clear_error_in_every_backend(backend, reference, case):
    bad_call, exception, words = CASES[case]
    with pytest.raises(exception) as expected:
        bad_call(reference)
    for word in words:
        assert word in str(expected.value), f"message {str(expected.value)!r} does not mention {word!r}"
    with pytest.raises(exception) as raised:
        bad_call(backend)
    assert type(raised.value) is type(expected.value)
    assert str(raised.value) == str(expected.value)


def test_a_file_that_is_not_a_weights_file_is_refused(backend, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not weights")
    with pytest.raises(WeightsFileError, match="is not a safetensors file"):
        backend.impl.load_model(str(text))
    with pytest.raises(WeightsFileError, match="is not a file"):
        backend.impl.load_model(str(tmp_path / "missing.safetensors"))
    from safetensors.numpy import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": np.zeros(3, "float32")}, str(foreign))
    with pytest.raises(WeightsFileError, match="without transformer_spec metadata"):
        backend.impl.load_model(str(foreign))


def test_a_weights_file_for_another_config_names_the_keys(backend, tmp_path):
    path = tmp_path / "lm.safetensors"
    save_params(path, init_params(LM), LM)
    model = backend.impl.load_model(str(path))
    with pytest.raises(WeightsError, match="missing keys"):
        backend.impl.build_model(TINY, backend.impl.to_params(model))


# ------------------------------------------------------------------ random cases, drawn by hypothesis
@hypothesis_settings(max_examples=30)
@given(case=bad_model_calls())
def test_random_bad_model_inputs_raise_the_references_error(backend, reference, case):
    config, label, args, kwargs = case
    params = init_params(config, seed=1, dtype="float64")

    def call(b):
        return b.call(b.impl.build_model(config, params), *args, **kwargs)

    same_outcome(backend, reference, call, f"{label} into {config.kind}", layers=layer_count(config))


@hypothesis_settings(max_examples=40)
@given(case=bad_component_calls())
def test_random_bad_component_inputs_raise_the_references_error(backend, reference, case):
    config, name, schema, label, args = case
    params = init_params(config, seed=2, dtype="float64", component=schema)
    same_outcome(backend, reference, lambda b: b.call(b.build(name, config, params), *args), label, layers=1)


@hypothesis_settings(max_examples=25)
@given(config=configs(), other=configs(), dtype=st.sampled_from(DRAWN_DTYPES))
def test_weights_of_another_config_are_refused_with_the_references_message(backend, reference, config, other, dtype):
    """init_params(other) into build_model(config): the same WeightsError (missing, unexpected or
    misshapen keys) in every backend; where the two schemas agree, the same model."""
    params = init_params(other, seed=4, dtype=dtype)
    try:
        reference.impl.build_model(config, params)
    except (WeightsError, ValueError) as error:
        with pytest.raises(type(error)) as raised:
            backend.impl.build_model(config, params)
        assert str(raised.value) == str(error)
    else:
        backend.impl.build_model(config, params)
