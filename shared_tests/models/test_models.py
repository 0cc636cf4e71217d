"""Whole models, every output field, in every backend and dtype, against the NumPy float64 reference;
models drawn at random by hypothesis (helpers.py's strategies), at their real positions; and the
properties every model must have, checked in each backend on its own outputs (causality, padding,
permutation equivariance without positions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer_spec import init_params

from ..cases import (
    DTYPES,
    SHAPES,
    TINY,
    VARIANTS,
    as_kind,
    flatten_output,
    model_inputs,
    shape_params,
    token_ids,
    variant_params,
)
from ..helpers import cast_params, check_close, hypothesis_settings, layer_count, model_cases, real_positions
from ..tolerances import assert_close

KINDS = ("encoder_decoder", "decoder_only", "encoder_only")


def run_model(backend, reference, config, dtype, inputs, **kwargs):
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    want = reference.call(reference.impl.build_model(config, params), *inputs, **kwargs)
    model = backend.impl.build_model(config, {k: v.astype(dtype) for k, v in params.items()})
    got = backend.call(model, *inputs, **kwargs)
    return got, want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", shape_params())
@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", KINDS)
def test_model_outputs_match_reference(backend, reference, kind, config, shape, dtype):
    config = as_kind(config, kind)
    inputs = model_inputs(config, shape)
    got, want = run_model(backend, reference, config, dtype, inputs, return_attentions=True, return_hidden_states=True)
    got, want = flatten_output(got), flatten_output(want)
    assert got.keys() == want.keys()
    expected_layers = config.num_decoder_layers if config.uses_decoder else config.num_encoder_layers
    assert sum(k.startswith("attentions[") for k in want) == expected_layers
    assert sum(k.startswith("hidden_states[") for k in want) == expected_layers + 1
    for name in want:
        assert got[name].dtype == dtype, f"{name} came back as {got[name].dtype}, expected {dtype}"
        assert_close(got[name], want[name], dtype, name)


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_are_the_same_with_and_without_returning_attentions(backend, kind):
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    inputs = model_inputs(config, (3, 11, 7, True))
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    model = backend.impl.build_model(config, params)
    plain = backend.call(model, *inputs)
    full = backend.call(model, *inputs, return_attentions=True, return_hidden_states=True)
    field = "logits" if config.uses_decoder else "last_hidden_state"
    assert_close(getattr(plain, field), getattr(full, field), "float64", field)
    assert plain.attentions == () and plain.hidden_states == ()


# ------------------------------------------------------------------ final norms per stack
@pytest.mark.parametrize("encoder_final_norm", [True, False])
def test_the_encoder_and_decoder_final_norms_follow_their_own_flags(backend, reference, encoder_final_norm):
    """One stack with a final norm and the other without (no variant of cases.py has that):
    kills a stack that reads the other stack's flag (torch-decoder-final-norm-reads-encoder-flag,
    jax-encoder-final-norm-reads-decoder-flag)."""
    config = TINY.replace(
        norm_first=True, encoder_final_norm=encoder_final_norm, decoder_final_norm=not encoder_final_norm
    )
    assert config.encoder_final_norm is encoder_final_norm
    assert config.decoder_final_norm is (not encoder_final_norm)
    params = init_params(config, seed=0, dtype="float64", nonzero_biases=True)
    assert ("encoder.norm.weight" in params) is encoder_final_norm
    assert ("decoder.norm.weight" in params) is (not encoder_final_norm)
    model = backend.impl.build_model(config, params)
    assert (model.encoder.norm is not None) is encoder_final_norm
    assert (model.decoder.norm is not None) is (not encoder_final_norm)
    inputs = model_inputs(config, SHAPES["padded-3x11x7"])
    got = backend.call(model, *inputs)
    want = reference.impl.build_model(config, params)(*inputs)
    assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state, "float64", "encoder output")
    assert_close(got.logits, want.logits, "float64", "logits")


# ------------------------------------------------------------------ properties
# Properties every model must have, checked in each backend on its own outputs.
DTYPE = "float64"  # properties are exact in real arithmetic: test them where rounding is smallest


def build(backend, config, seed=7):
    return backend.impl.build_model(config, init_params(config, seed=seed, dtype=DTYPE, nonzero_biases=True))


@pytest.mark.parametrize(
    "config", [pytest.param(VARIANTS[n], id=n) for n in ("post-relu-sinusoidal", "pre-gelu-learned")]
)
def test_future_tokens_do_not_change_past_decoder_outputs(backend, config):
    lm = build(backend, as_kind(config, "decoder_only"))
    ids = token_ids(47, 2, 9, pad=False)  # valid for both vocabularies (53 and 47)
    changed = ids.copy()
    changed[:, 5:] = (changed[:, 5:] + 7) % 46 + 1  # new tokens from position 5 on
    before, after = backend.call(lm, ids).logits, backend.call(lm, changed).logits
    assert_close(after[:, :5], before[:, :5], DTYPE, "logits before the change")
    assert np.abs(after[:, 5:] - before[:, 5:]).max() > 1e-3  # and the change did reach later positions

    seq2seq = build(backend, config)
    src = token_ids(53, 2, 6, pad=False, seed=3)
    before, after = backend.call(seq2seq, src, ids).logits, backend.call(seq2seq, src, changed).logits
    assert_close(after[:, :5], before[:, :5], DTYPE, "encoder-decoder logits before the change")


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_adding_padding_does_not_change_outputs_at_real_tokens(backend, kind):
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    model = build(backend, config)
    field = "logits" if config.uses_decoder else "last_hidden_state"
    ids = token_ids(47, 2, 6, pad=False)
    padded = np.concatenate([ids, np.zeros((2, 5), ids.dtype)], axis=1)  # 5 pad tokens after the real ones
    if kind == "encoder_decoder":
        src = token_ids(53, 2, 8, pad=False, seed=4)
        src_padded = np.concatenate([src, np.zeros((2, 3), src.dtype)], axis=1)
        short = getattr(backend.call(model, src, ids), field)
        long = getattr(backend.call(model, src_padded, padded), field)
    else:
        short, long = getattr(backend.call(model, ids), field), getattr(backend.call(model, padded), field)
    assert_close(long[:, :6], short, DTYPE, f"{field} at real tokens")


def test_a_fully_padded_sequence_gives_finite_outputs(backend):
    config = as_kind(VARIANTS["post-relu-sinusoidal"], "encoder_only")
    model = build(backend, config)
    ids = token_ids(53, 2, 5, pad=False)
    ids[1] = 0  # the second sequence is nothing but padding
    out = backend.call(model, ids, return_attentions=True).attentions
    assert all(np.all(np.isfinite(w)) for w in out)
    assert all(np.all(w[1] == 0.0) for w in out)


def test_encoder_without_positions_is_permutation_equivariant(backend):
    config = as_kind(VARIANTS["pre-relu-none-tied-nofinal"], "encoder_only")
    model = build(backend, config)
    ids = token_ids(53, 2, 9, pad=False)
    perm = np.random.default_rng(3).permutation(9)
    out = backend.call(model, ids).last_hidden_state
    permuted = backend.call(model, ids[:, perm]).last_hidden_state
    assert_close(permuted, out[:, perm], DTYPE, "encoder output of permuted input")


# ------------------------------------------------------------------ random models, drawn by hypothesis
@hypothesis_settings(max_examples=10)
@given(case=model_cases(), seed=st.integers(0, 2**10))
def test_random_models_give_the_references_logits_at_real_positions(backend, reference, case, seed):
    config, dtype, inputs, kwargs = case
    params = init_params(config, seed=seed, dtype="float64", nonzero_biases=True)
    want = reference.call(reference.impl.build_model(config, params), *inputs, **kwargs)
    got = backend.call(backend.impl.build_model(config, cast_params(params, dtype)), *inputs, **kwargs)
    field = "logits" if config.uses_decoder else "last_hidden_state"
    real = real_positions(config, inputs)  # (B, T)
    got_field, want_field = getattr(got, field), getattr(want, field)
    assert got_field.dtype == dtype and got_field.shape == want_field.shape
    assert np.all(np.isfinite(got_field)), f"non-finite {field} (padding included)"
    check_close(got_field[real], want_field[real], dtype, layer_count(config), f"{field} at real positions of {config}")
    if config.pooler:  # BERT's pooler reads position 0: compare the rows where it is a real token
        check_close(got.pooler_output[real[:, 0]], want.pooler_output[real[:, 0]], dtype, layer_count(config), "pooler_output")
