"""The modern decoder's parts (Llama, SmolLM2): RMSNorm, the gated feed-forward (SwiGLU, GeGLU),
rotary position embedding in both layouts, grouped- and multi-query attention, per-part biases,
the logits bias and the halves sinusoids -- each alone and in whole models of every kind, in
every backend and dtype, against the NumPy float64 reference; NumPy's hand-written backward
against finite differences; decoding with a cache of key/value heads only.

Sizes stay odd and pairwise different: d_model 54 in 9 query heads of 6 and 3 key/value heads
(SmolLM2's ratio), d_ff 37, vocabularies 53 and 47.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_convert.rope import convert_rope_layout, halves_to_interleaved, interleaved_to_halves
from transformer_run.data import BOS, EOS
from transformer_spec import Config, init_params, param_schema

from ..cases import TINY, as_kind, flatten_output, hidden, model_inputs, token_ids
from ..helpers import (
    build,
    check_finite_differences,
    check_model_against_finite_differences,
    module_arrays,
    output_weights,
    run_component,
    training_batch,
)
from ..tolerances import assert_close, assert_loss_and_gradients_match

DTYPES = ("float64", "float32")
KINDS = ("encoder_decoder", "decoder_only", "encoder_only")

# The paper's model with every modern part switched in: Llama's layer at TINY's odd sizes.
MODERN = TINY.replace(
    d_model=54, num_heads=9, num_kv_heads=3, norm="rms_norm", activation="silu", gated_ffn=True,
    positional="rotary", rope_theta=100000.0, bias=False, norm_first=True, scale_embeddings=False,
)  # fmt: skip
VARIANTS = {
    "llama": MODERN,  # GQA 9 / 3, SwiGLU, RMSNorm, halves RoPE, no biases, untied
    "mqa-tied-biased-interleaved-geglu": MODERN.replace(
        num_kv_heads=1, tie_output=True, bias=True, rope_layout="interleaved", activation="gelu"
    ),
    "post-layernorm-rotary-mha-logitsbias": MODERN.replace(
        num_kv_heads=None,
        norm="layer_norm",
        norm_first=False,
        gated_ffn=False,
        activation="relu",
        bias=True,
        ffn_bias=False,
        final_logits_bias=True,
    ),  # fmt: skip
    "marian-like": TINY.replace(sinusoid_layout="halves", final_logits_bias=True, tie_output=True, activation="silu"),
}


def variant_params(names=None):
    return [pytest.param(VARIANTS[name], id=name) for name in (names or VARIANTS)]


# ------------------------------------------------------------------------------ components
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_rms_norm_matches_reference(backend, reference, dtype, eps):
    config = MODERN.replace(layer_norm_eps=eps)
    x = hidden(3, 7, config.d_model) * 4.0 + 3.0
    got, want = run_component(backend, reference, "RMSNorm", config, dtype, x)
    assert_close(got, want, dtype, "RMSNorm")


def test_rms_norm_is_x_over_its_root_mean_square_times_the_weight(reference):
    config = MODERN.replace(layer_norm_eps=1e-5)
    params = init_params(config, component="rms_norm", dtype="float64", nonzero_biases=True)
    assert list(params) == ["weight"]  # no bias
    x = hidden(2, 3, config.d_model)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * params["weight"]
    np.testing.assert_allclose(reference.build("RMSNorm", config, params)(x), want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("ffn_bias", [False, True])
def test_gated_feed_forward_matches_reference(backend, reference, dtype, activation, ffn_bias):
    config = MODERN.replace(activation=activation, ffn_bias=ffn_bias)
    got, want = run_component(backend, reference, "GatedFeedForward", config, dtype, hidden(3, 11, config.d_model))
    assert_close(got, want, dtype, "gated feed-forward")


def test_swiglu_is_silu_of_the_gate_times_the_up_projection_then_down(reference):
    config = MODERN
    params = init_params(config, component="gated_feed_forward", dtype="float64")
    x = hidden(2, 5, config.d_model)
    gate, up = x @ params["w_gate.weight"], x @ params["w_up.weight"]
    want = (gate / (1.0 + np.exp(-gate)) * up) @ params["w_down.weight"]
    got = reference.build("GatedFeedForward", config, params)(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_matches_reference(backend, reference, dtype):
    x = np.linspace(-30, 30, 241).astype(dtype)
    assert_close(backend.call(backend.impl.silu, x), reference.impl.silu(x.astype("float64")), dtype, "silu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("offset", [0, 5])
def test_rotary_embedding_matches_reference(backend, reference, dtype, layout, offset):
    config = MODERN.replace(rope_layout=layout)
    x = np.random.default_rng(2).standard_normal((2, 3, 7, config.d_k))
    want = reference.impl.RotaryEmbedding(config, "float64")(x, offset)
    got = backend.call(backend.impl.RotaryEmbedding(config, dtype), x.astype(dtype), offset)
    assert_close(got, want, dtype, f"rotary {layout}")


def test_rotary_tables_are_the_rope_angles(backend, reference):
    cos, sin = (backend.to_numpy(t) for t in backend.impl.rotary_tables(50, 6, 10000.0, "float64"))
    angle = np.arange(50)[:, None] * 10000.0 ** (-np.arange(0, 6, 2) / 6)
    np.testing.assert_allclose(cos, np.cos(angle), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin, np.sin(angle), rtol=0, atol=1e-15)


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_rotary_scores_depend_only_on_the_distance_between_positions(reference, layout):
    """q_m . k_n with RoPE = a function of m - n: shifting both positions changes nothing."""
    config = MODERN.replace(rope_layout=layout)
    rope = reference.impl.RotaryEmbedding(config, "float64")
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((1, 1, 1, config.d_k)), rng.standard_normal((1, 1, 1, config.d_k))
    scores = [float((rope(q, m) * rope(k, m - 4)).sum()) for m in (4, 9, 30, 60)]
    np.testing.assert_allclose(scores, scores[0], rtol=1e-12)
    assert abs(float((rope(q, 9) * rope(k, 9)).sum()) - scores[0]) > 1e-3  # another distance, another score


def test_the_two_rope_layouts_are_one_permutation_of_q_and_k_apart(reference):
    """The same attention in both layouts, given weights permuted by ``transformer_convert.rope``;
    unpermuted weights in the wrong layout give another function (the GGUF/HF mix-up)."""
    config = MODERN
    params = init_params(config, seed=3, dtype="float64", component="attention", nonzero_biases=True)
    x = hidden(2, 9, config.d_model)
    halves = reference.build("MultiHeadAttention", config, params)
    want, _ = halves(x, x, x)
    interleaved_config = config.replace(rope_layout="interleaved")
    permuted = convert_rope_layout(params, config, "interleaved")
    got, _ = reference.build("MultiHeadAttention", interleaved_config, permuted)(x, x, x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    wrong, _ = reference.build("MultiHeadAttention", interleaved_config, params)(x, x, x)
    assert np.abs(wrong - want).max() > 1e-2
    w = params["w_q.weight"]
    np.testing.assert_array_equal(interleaved_to_halves(halves_to_interleaved(w, 9), 9), w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads", [9, 3, 1])
@pytest.mark.parametrize("rotary", [True, False])
@pytest.mark.parametrize("t_q,t_k", [(11, 11), (7, 11), (1, 5)])
def test_grouped_query_attention_matches_reference(backend, reference, dtype, kv_heads, rotary, t_q, t_k):
    config = MODERN.replace(num_kv_heads=kv_heads, bias=True)
    params = init_params(config, seed=3, dtype="float64", component="attention", nonzero_biases=True)
    assert params["w_k.weight"].shape == (config.d_model, kv_heads * config.d_k)
    query, memory = hidden(3, t_q, config.d_model, seed=1), hidden(3, t_k, config.d_model, seed=2)
    mask = np.random.default_rng(4).random((3, 1, t_q, t_k)) > 0.3
    mask[0, 0, 0] = False  # a fully masked row: weights 0, context 0 (the output is w_o's bias)

    config = config if rotary else config.replace(positional="sinusoidal")  # a standalone attention: no rotation
    want = reference.call(
        reference.build("MultiHeadAttention", config, params, "float64"), query, memory, memory, mask, True
    )
    args = (query.astype(dtype), memory.astype(dtype), memory.astype(dtype), mask, True)
    got = backend.call(backend.build("MultiHeadAttention", config, params, dtype), *args)
    assert got[1].shape == (3, config.num_heads, t_q, t_k)
    assert_close(got[0], want[0], dtype, "GQA output")
    assert_close(got[1], want[1], dtype, "GQA weights")
    assert np.all(want[1][0, :, 0] == 0)
    np.testing.assert_allclose(want[0][0, 0], params["w_o.bias"], rtol=0, atol=1e-15)


def test_grouped_query_attention_is_multi_head_attention_with_each_kv_head_repeated(reference):
    """Query head h reads key/value head h // groups (HF's repeat_kv), not h % kv_heads."""
    config = MODERN
    params = init_params(config, seed=3, dtype="float64", component="attention", nonzero_biases=True)
    full = dict(params)
    for name in ("w_k.weight", "w_v.weight"):
        heads = params[name].reshape(config.d_model, config.num_kv_heads, config.d_k)
        full[name] = np.repeat(heads, 3, axis=1).reshape(config.d_model, config.d_model)
    x = hidden(2, 9, config.d_model)
    want, _ = reference.build("MultiHeadAttention", config.replace(num_kv_heads=None), full)(x, x, x)
    got, _ = reference.build("MultiHeadAttention", config, params)(x, x, x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("d_model", [36, 37])
def test_sinusoid_layouts_match_reference(backend, reference, dtype, layout, d_model):
    got = backend.to_numpy(backend.impl.sinusoidal_table(50, d_model, dtype, layout))
    want = reference.impl.sinusoidal_table(50, d_model, "float64", layout)
    assert_close(got, want, dtype, f"sinusoids {layout}")
    interleaved = reference.impl.sinusoidal_table(50, d_model, "float64")
    sines = (d_model + 1) // 2  # halves: every sine column (ceil(d/2) of them), then every cosine
    if layout == "halves":  # the same columns, reordered
        np.testing.assert_array_equal(want[:, :sines], interleaved[:, 0::2])
        np.testing.assert_array_equal(want[:, sines:], interleaved[:, 1::2])


# ------------------------------------------------------------------------------ whole models
def run_model(backend, reference, config, dtype, inputs, **kwargs):
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    want = reference.call(reference.impl.build_model(config, params), *inputs, **kwargs)
    model = backend.impl.build_model(config, {k: v.astype(dtype) for k, v in params.items()})
    return backend.call(model, *inputs, **kwargs), want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", KINDS)
def test_modern_models_match_reference(backend, reference, kind, config, dtype):
    config = as_kind(config, kind)
    inputs = model_inputs(config, (3, 11, 7, True))
    got, want = run_model(backend, reference, config, dtype, inputs, return_attentions=True, return_hidden_states=True)
    got, want = flatten_output(got), flatten_output(want)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == dtype, f"{name} came back as {got[name].dtype}, expected {dtype}"
        assert_close(got[name], want[name], dtype, name)


def test_the_smollm2_preset_has_the_real_models_shapes():
    config = Config.preset("smollm2-135m")
    schema = param_schema(config)
    assert schema["decoder.layers.0.self_attn.w_k.weight"] == (576, 192)  # 3 kv heads of 64
    assert schema["decoder.layers.29.ffn.w_down.weight"] == (1536, 576)
    assert "generator.proj.weight" not in schema  # tied
    assert not any(name.endswith("bias") for name in schema)
    assert sum(int(np.prod(s)) for s in schema.values()) == 134_515_008  # SmolLM2-135M's parameter count


# ------------------------------------------------------------------------------ gradients
def test_rms_norm_backward_matches_finite_differences(reference):
    config = MODERN
    norm, schema = build(reference, "RMSNorm", config)
    x = hidden(2, 5, config.d_model) * 3.0
    r = output_weights((2, 5, config.d_model))
    from numpy_impl.module import enable_grad

    with enable_grad():
        norm(x)
    grad_x, grads = norm.backward(r)
    loss = lambda: float((norm(x) * r).sum())  # noqa: E731
    check_finite_differences("RMSNorm", loss, {"x": x} | module_arrays(norm, schema, config), {"x": grad_x} | grads)


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_gated_feed_forward_backward_matches_finite_differences(reference, activation):
    config = MODERN.replace(activation=activation, ffn_bias=True)
    ffn, schema = build(reference, "GatedFeedForward", config)
    x = hidden(2, 5, config.d_model)
    r = output_weights((2, 5, config.d_model))
    from numpy_impl.module import enable_grad

    with enable_grad():
        ffn(x)
    grad_x, grads = ffn.backward(r)
    loss = lambda: float((ffn(x) * r).sum())  # noqa: E731
    check_finite_differences("gated FFN", loss, {"x": x} | module_arrays(ffn, schema, config), {"x": grad_x} | grads)


@pytest.mark.parametrize("kv_heads", [3, 1])
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_rotary_grouped_query_self_attention_backward_matches_finite_differences(reference, kv_heads, layout):
    config = MODERN.replace(num_kv_heads=kv_heads, rope_layout=layout, bias=True)
    params = init_params(config, seed=3, dtype="float64", component="attention", nonzero_biases=True)
    attention = reference.impl.from_params(reference.impl.MultiHeadAttention, config, params)
    assert attention.rotary is not None  # positional="rotary": a standalone attention rotates too
    x = hidden(2, 6, config.d_model)
    mask = np.tril(np.ones((6, 6), bool))[None, None]
    r = output_weights((2, 6, config.d_model))
    from numpy_impl.module import enable_grad

    with enable_grad():
        attention(x, x, x, mask)
    grad_x, grads = attention.self_attention_backward(r)
    loss = lambda: float((attention(x, x, x, mask)[0] * r).sum())  # noqa: E731
    arrays = {"x": x} | module_arrays(attention, "attention", config)
    check_finite_differences("rotary GQA", loss, arrays, {"x": grad_x} | grads)


@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", ("encoder_decoder", "decoder_only"))
def test_modern_model_gradients_match_finite_differences(reference, kind, config):
    config = as_kind(config, kind)
    check_model_against_finite_differences(reference, config, training_batch(config), 0.1)


@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", ("encoder_decoder", "decoder_only"))
def test_modern_loss_and_gradients_match_reference(backend, reference, kind, config):
    config = as_kind(config, kind)
    batch = training_batch(config)
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    want = reference.impl.loss_and_grads(reference.impl.build_model(config, params), batch, 0.1)
    got = backend.impl.loss_and_grads(backend.impl.build_model(config, params), batch, 0.1)
    assert list(got[1]) == list(param_schema(config))
    assert_loss_and_gradients_match(got, want, f"{kind} modern")


# ------------------------------------------------------------------------------ decoding
def lm(backend, config, dtype="float64"):
    params = init_params(config, seed=5, dtype="float64", nonzero_biases=True)
    return backend.impl.build_model(config, {name: value.astype(dtype) for name, value in params.items()})


LM_VARIANTS = ["llama", "mqa-tied-biased-interleaved-geglu"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", variant_params(LM_VARIANTS))
def test_rotary_cache_holds_kv_heads_and_cached_equals_uncached(backend, config, dtype):
    """The cache holds H_kv heads (3, or 1), not H (9); step by step, fed the same tokens, the
    cached and uncached steppers agree, RoPE positions continuing from the cache."""
    config = as_kind(config, "decoder_only")
    model = lm(backend, config, dtype)
    cached, uncached = backend.impl.make_stepper(model), backend.impl.make_stepper(model, cached=False)
    prompts = token_ids(config.tgt_vocab_size, 3, 5, pad=True, pad_id=config.pad_id, seed=2)
    cached_state, uncached_state = cached.start(prompts), uncached.start(prompts)
    keys = backend.to_numpy(cached_state.cache[0].self_attn.k)
    assert keys.shape[:2] == (3, config.num_kv_heads) and keys.shape[-1] == config.d_k
    tokens = np.full(3, BOS)
    for position in range(4):
        cached_logits, cached_state = cached.step(cached_state, tokens, position)
        uncached_logits, uncached_state = uncached.step(uncached_state, tokens, position)
        assert_close(cached_logits, uncached_logits, dtype, f"cached vs uncached logits at step {position}")
        tokens = uncached_logits.argmax(axis=-1)


@pytest.mark.parametrize("config", variant_params(LM_VARIANTS))
@pytest.mark.parametrize("kind", ("decoder_only", "encoder_decoder"))
def test_modern_models_decode_the_same_tokens_in_every_backend(backend, reference, kind, config):
    config = as_kind(config, kind)
    model, want_model = lm(backend, config), lm(reference, config)
    vocab = config.tgt_vocab_size if kind == "decoder_only" else config.src_vocab_size
    src = token_ids(vocab, 3, 5, pad=True, pad_id=config.pad_id, seed=2)
    want = reference.impl.greedy(want_model, src, BOS, EOS, 6)
    assert backend.impl.greedy(model, src, BOS, EOS, 6).tolist() == want.tolist()
    assert backend.impl.greedy(model, src, BOS, EOS, 6, cached=False).tolist() == want.tolist()
    got = backend.impl.beam(model, src, BOS, EOS, 6, beam_size=3, length_penalty=0.6)
    beams = reference.impl.beam(want_model, src, BOS, EOS, 6, beam_size=3, length_penalty=0.6)
    assert got.ids.tolist() == beams.ids.tolist()
    np.testing.assert_allclose(got.scores, beams.scores, rtol=1e-9)


def test_left_padding_does_not_change_a_rotary_models_continuation(backend):
    """RoPE sees only distances: a prompt padded on the left (padding hidden from attention)
    continues exactly as it does alone, though its tokens sit at other absolute positions."""
    config = as_kind(VARIANTS["llama"], "decoder_only")
    model = lm(backend, config)
    prompt = token_ids(config.tgt_vocab_size, 1, 4, pad=False, seed=7)
    padded = np.concatenate([np.full((1, 3), config.pad_id), prompt], axis=1)
    stepper = backend.impl.make_stepper(model)
    alone, alone_state = stepper.step(stepper.start(prompt), np.array([BOS]), 0)
    left, left_state = stepper.step(stepper.start(padded), np.array([BOS]), 0)
    assert_close(left, alone, "float64", "left-padded vs alone")
    assert (
        backend.impl.greedy(model, padded, BOS, EOS, 5).tolist()
        == backend.impl.greedy(model, prompt, BOS, EOS, 5).tolist()
    )


# ------------------------------------------------------------------------------ sampling
def test_filter_logits_applies_temperature_then_top_k_then_top_p():
    from transformer_run.decoding import filter_logits

    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    np.testing.assert_allclose(filter_logits(logits), [[0.5, 0.2, 0.15, 0.1, 0.05]], rtol=1e-12)
    np.testing.assert_allclose(filter_logits(logits, top_k=2), [[0.5 / 0.7, 0.2 / 0.7, 0, 0, 0]], rtol=1e-12)
    # nucleus: the smallest set reaching 0.8 is {0.5, 0.2, 0.15} (0.5 + 0.2 = 0.7 falls short)
    np.testing.assert_allclose(filter_logits(logits, top_p=0.8), [[0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0]])
    np.testing.assert_allclose(filter_logits(logits, top_p=0.3), [[1, 0, 0, 0, 0]])  # the top token always stays
    cold = filter_logits(logits, temperature=0.5)  # p^2, renormalised
    squared = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(cold, [squared / squared.sum()], rtol=1e-12)


class _FixedLogits:
    """A stepper whose every step returns the same logits: the sampler alone is tested."""

    def __init__(self, logits):
        self.logits = logits

    def start(self, src_ids, max_new=None):
        return None

    def step(self, state, tokens, position):
        return np.repeat(self.logits[None], len(tokens), axis=0), state

    def reorder(self, state, rows):
        return state


def test_sampling_draws_tokens_with_their_probabilities():
    from transformer_run.decoding import sample_decode

    probs = np.array([0.5, 0.3, 0.2, 0.0])
    ids = sample_decode(_FixedLogits(np.log(probs + 1e-300)), np.zeros((4000, 0), np.int64), 0, -1, 5, seed=3)
    counts = np.bincount(ids[:, 1:].ravel(), minlength=4) / ids[:, 1:].size
    np.testing.assert_allclose(counts, probs, atol=0.01)  # 20000 draws: 3 standard errors is ~0.01
    again = sample_decode(_FixedLogits(np.log(probs + 1e-300)), np.zeros((4000, 0), np.int64), 0, -1, 5, seed=3)
    assert (again == ids).all()  # seeded: reproducible


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": 0.0}, "temperature must be a positive finite number"),
        ({"temperature": float("nan")}, "temperature must be a positive finite number"),
        ({"top_k": 0}, "top_k must be a positive integer"),
        ({"top_k": 2.5}, "top_k must be a positive integer"),
        ({"top_p": 0.0}, r"top_p must be a probability in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be a probability in \(0, 1\]"),
    ],
)
def test_bad_sampling_arguments_are_refused_in_every_backend(backend, kwargs, message):
    model = lm(backend, as_kind(VARIANTS["llama"], "decoder_only"))
    with pytest.raises(ValueError, match=message):
        backend.impl.sample(model, np.ones((1, 2), np.int64), BOS, EOS, 3, **kwargs)


def test_sampling_gives_the_same_tokens_in_every_backend(backend, reference):
    """Seeded, float64: the logits agree to ~1e-15, so the draws land on the same tokens."""
    config = as_kind(VARIANTS["llama"], "decoder_only")
    prompts = token_ids(config.tgt_vocab_size, 3, 5, pad=True, pad_id=config.pad_id, seed=2)
    kwargs = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11}
    want = reference.impl.sample(lm(reference, config), prompts, BOS, EOS, 8, **kwargs)
    got = backend.impl.sample(lm(backend, config), prompts, BOS, EOS, 8, **kwargs)
    assert got.tolist() == want.tolist()
    assert len({tuple(row) for row in want[:, 1:].tolist()}) > 1  # not all rows alike: it did sample


def test_prompts_continue_from_their_last_token_given_as_one_bos_per_row(backend):
    """bos per row (B,): continuing prompts (all but their last token as src_ids) is the forward
    pass's argmax after the whole prompt."""
    config = as_kind(VARIANTS["llama"], "decoder_only")
    model = lm(backend, config)
    prompts = token_ids(config.tgt_vocab_size, 2, 6, pad=False, seed=4)
    out = backend.impl.greedy(model, prompts[:, :-1], prompts[:, -1], EOS, 1)
    assert out[:, 0].tolist() == prompts[:, -1].tolist()
    logits = backend.call(model, prompts).logits  # NumPy, from the adapter
    assert out[:, 1].tolist() == logits[:, -1].argmax(-1).tolist()
    with pytest.raises(ValueError, match=r"bos must be one integer id or one per row \(2,\)"):
        backend.impl.greedy(model, prompts[:, :-1], np.array([1, 2, 3]), EOS, 1)
