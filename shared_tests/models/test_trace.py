"""Tracing: every backend names the same intermediates, in the same order, with the same values;
``transformer-ref trace`` finds the first place two backends part; ``attention`` draws them."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_cli.inputs import ModelInput
from transformer_cli.main import main
from transformer_cli.trace import compare_traces, trace_runs
from transformer_spec import init_params
from transformer_spec.trace import record, recording

from ..cases import DTYPES, SHAPES, TINY, VARIANTS, as_kind, model_inputs
from ..helpers import needs
from ..tolerances import assert_close

KINDS = ("encoder_decoder", "decoder_only", "encoder_only")


def _trace(backend, config, params, inputs, dtype):
    model = backend.impl.build_model(config, {k: v.astype(dtype) for k, v in params.items()})
    return backend.impl.trace_model(model, *[backend.asarray(x) for x in inputs])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["post-relu-sinusoidal", "pre-gelu-learned"])
def test_every_intermediate_has_the_reference_name_shape_and_value(backend, reference, kind, dtype, variant):
    config = as_kind(VARIANTS[variant], kind)
    params = init_params(config, seed=0, dtype="float64", nonzero_biases=True)
    inputs = model_inputs(config, SHAPES["padded-3x11x7"])
    want = _trace(reference, config, params, inputs, "float64")
    got = _trace(backend, config, params, inputs, dtype)
    assert list(got) == list(want)  # the same names in the same order
    layers = config.num_encoder_layers + config.num_decoder_layers
    assert len(want) >= 14 * layers  # q, k, v, scores, weights, context, ... per layer: nothing skipped
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert_close(got[name], value, dtype, name)


def test_names_follow_the_weights_names():
    """``encoder.layers.1.self_attn.q`` is made with ``encoder.layers.1.self_attn.w_q.weight``."""
    from numpy_impl import build_model, trace_model

    params = init_params(TINY, seed=0)
    trace = trace_model(build_model(TINY, params), *model_inputs(TINY, SHAPES["batch1"]))
    modules = {name.rsplit(".", 1)[0] for name in trace}  # "encoder.layers.1.self_attn"
    weight_paths = {name[:i] for name in params for i, char in enumerate(name) if char == "."}
    assert modules <= weight_paths, modules - weight_paths  # every traced module owns weights of that name
    for layer in range(TINY.num_encoder_layers):
        for name in ("q", "k", "v", "scores", "weights", "context", "output"):
            assert f"encoder.layers.{layer}.self_attn.{name}" in trace
    assert "decoder.layers.0.cross_attn.weights" in trace and "generator.logits" in trace


def test_a_changed_weight_is_found_at_its_first_intermediate(backend):
    """What ``trace`` is for: a bug in one layer shows first where that layer computes."""
    params = init_params(TINY, seed=0, dtype="float64", nonzero_biases=True)
    inputs = model_inputs(TINY, SHAPES["padded-3x11x7"])
    model_input = ModelInput(TINY, params, inputs, [], "tiny")
    reference = trace_runs(model_input, [("numpy", "float64")])["numpy float64"]
    broken = dict(params)
    broken["encoder.layers.1.ffn.w_1.bias"] = params["encoder.layers.1.ffn.w_1.bias"] + 1e-6
    traces = {f"{backend.name} float64": _trace(backend, TINY, broken, inputs, "float64")}
    rows, first = compare_traces(reference, traces)
    assert first is not None and first.name == "encoder.layers.1.ffn.hidden"
    assert all(not row.over for row in rows[: rows.index(first)])  # everything before it agrees


def test_the_same_weights_agree_everywhere_in_compare_traces(backend):
    params = init_params(TINY, seed=0, dtype="float64")
    model_input = ModelInput(TINY, params, model_inputs(TINY, SHAPES["batch1"]), [], "tiny")
    traces = trace_runs(model_input, [("numpy", "float64"), (backend.name, "float64"), (backend.name, "float32")])
    rows, first = compare_traces(traces["numpy float64"], traces)
    assert first is None and len(rows) == len(traces["numpy float64"])


def test_outside_a_recording_record_does_nothing_and_a_stranger_module_is_refused():
    record(object(), x=np.ones(3))  # no recording: a no-op
    with recording({}) as trace, pytest.raises(KeyError, match="not part of the model"):
        record(object(), x=np.ones(3))
    assert trace == {}


def test_recorded_values_are_copies():
    module, value = object(), np.zeros(3)
    with recording({id(module): "m"}) as trace:
        record(module, x=value)
        value += 1  # an in-place update after the fact must not change the record
    assert np.all(trace["m.x"] == 0)


def test_jax_jitted_call_is_refused_while_recording():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from jax_impl import build_model, compiled, named_modules

    model = build_model(TINY, init_params(TINY, seed=0))
    src, tgt = (jnp.asarray(x) for x in model_inputs(TINY, SHAPES["batch1"]))
    with recording(named_modules(model)), pytest.raises(TypeError, match="no concrete value"):
        compiled(model)(src, tgt)  # jit-compiled: the intermediates are tracers


# ------------------------------------------------------------------------------ the commands
def test_trace_command_reports_agreement_and_the_table(capsys):
    needs("torch")
    assert main(["trace", "--backends", "numpy,torch", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "encoder.layers.0.self_attn.scores" in out and "all " in out and "agree within tolerance" in out


def test_trace_command_tokenizes_toy_text(capsys):
    assert main(["trace", "--backends", "numpy", "--preset", "tiny-lm", "--text", "the cat eats fish"]) == 0
    assert "input: <bos> the cat eats fish  (5 tokens)" in capsys.readouterr().out


def test_attention_command_writes_a_heatmap_per_layer_and_attention(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    text = toy_sentence()
    assert main(["attention", "--preset", "tiny", "--text", text, "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    layers = range(TINY.num_encoder_layers)
    want = [f"{kind}_layer{i}.png" for kind in ("decoder_cross", "decoder_self", "encoder_self") for i in layers]
    assert files == sorted(want)
    assert all((tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_attention_maps_are_the_same_from_every_backend(backend, reference):
    from transformer_cli.attention import attention_maps
    from transformer_cli.inputs import load_model_input

    class Args:
        weights, preset, text, target, seed, length = None, "tiny", toy_sentence(), None, 0, 7

    model_input = load_model_input(Args)
    want = attention_maps(model_input, "numpy", "float64")
    got = attention_maps(model_input, backend.name, "float64")
    assert [m[0] for m in got] == [m[0] for m in want]
    for (stem, _, weights, queries, keys), (_, _, want_weights, want_queries, want_keys) in zip(got, want, strict=True):
        assert (queries, keys) == (want_queries, want_keys)
        assert weights.shape == (TINY.num_heads, len(queries), len(keys))
        assert_close(weights, want_weights, "float64", stem)


def toy_sentence() -> str:
    from transformer_run.data import TOY_TRANSLATION

    return TOY_TRANSLATION[0][0]
