"""Whole models, every output field, in every backend and dtype, against the NumPy float64 reference."""

from __future__ import annotations

import pytest

from transformer_spec import init_params

from .cases import DTYPES, VARIANTS, as_kind, flatten_output, model_inputs, shape_params, variant_params
from .tolerances import assert_close

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
