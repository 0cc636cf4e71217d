"""Each component alone, in every backend and dtype, against the NumPy float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import Config, attention_to_heads, init_params

from ..cases import DTYPES, TINY, VARIANTS, hidden, token_ids, variant_params
from ..helpers import run_component
from ..tolerances import assert_close

pytestmark = pytest.mark.parametrize("dtype", DTYPES)



@pytest.mark.parametrize("d_model", [36, 37, 6, 1])
def test_sinusoidal_table_matches_reference_also_for_odd_d_model(backend, reference, dtype, d_model):
    got = backend.to_numpy(backend.impl.sinusoidal_table(50, d_model, dtype))
    want = reference.impl.sinusoidal_table(50, d_model, "float64")
    assert got.shape == (50, d_model) and got.dtype == np.dtype(dtype)
    assert_close(got, want, dtype, "sinusoidal table")
    # the paper's definition, checked at one entry: PE[pos, 2i] = sin(pos / 10000^(2i/d))
    assert want[7, 0] == pytest.approx(np.sin(7.0))
    if d_model > 1:
        assert want[7, 1] == pytest.approx(np.cos(7.0))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_activations_match_reference(backend, reference, dtype, activation):
    x = np.linspace(-6, 6, 241).astype(dtype)
    got = backend.call(getattr(backend.impl, activation), x)
    want = getattr(reference.impl, activation)(x.astype("float64"))
    assert_close(got, want, dtype, activation)


def test_exact_and_tanh_gelu_differ_by_the_documented_amount(reference, dtype):
    x = np.linspace(-6, 6, 2401)
    gap = np.abs(reference.impl.gelu(x) - reference.impl.gelu_tanh(x)).max()
    assert 1e-4 < gap < 1e-3  # measured ~4.7e-4; a backend that mixes them up fails the tests above


@pytest.mark.parametrize("eps", [1e-5, 1e-12])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_reference(backend, reference, dtype, eps, bias):
    config = TINY.replace(layer_norm_eps=eps, bias=bias)
    x = hidden(3, 7, config.d_model) * 4.0 + 100.0  # a large mean: fast-variance formulas lose digits here
    got, want = run_component(backend, reference, "LayerNorm", config, dtype, x)
    assert_close(got, want, dtype, "LayerNorm")


def test_layer_norm_uses_biased_variance_and_eps_inside_the_sqrt(reference, dtype):
    config = TINY.replace(layer_norm_eps=1e-5)
    params = init_params(config, component="layer_norm", dtype="float64")
    norm = reference.build("LayerNorm", config, params)
    x = hidden(2, 3, config.d_model)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)  # np.var is the biased one
    np.testing.assert_allclose(norm(x), (x - mean) / np.sqrt(var + 1e-5), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("config", variant_params())
def test_feed_forward_matches_reference(backend, reference, dtype, config):
    got, want = run_component(
        backend, reference, "PositionwiseFeedForward", config, dtype, hidden(3, 11, config.d_model)
    )
    assert_close(got, want, dtype, "feed-forward")


@pytest.mark.parametrize("t_q,t_k", [(11, 11), (7, 11), (1, 5), (4, 1)])
def test_scaled_dot_product_attention_matches_reference(backend, reference, dtype, t_q, t_k):
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((3, 2, t_q, 5)),
        rng.standard_normal((3, 2, t_k, 5)),
        rng.standard_normal((3, 2, t_k, 4)),
    )
    mask = rng.random((3, 1, t_q, t_k)) < 0.7
    mask[:, :, :, 0] = True  # every row keeps at least one key here (empty rows have their own test)
    f = backend.impl.scaled_dot_product_attention
    got = backend.call(f, q.astype(dtype), k.astype(dtype), v.astype(dtype), mask)
    want = reference.impl.scaled_dot_product_attention(q, k, v, mask)
    assert_close(got[0], want[0], dtype, "attention output")
    assert_close(got[1], want[1], dtype, "attention weights")


@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("t_q,t_k", [(11, 11), (7, 11), (1, 1)])
def test_multi_head_attention_matches_reference(backend, reference, dtype, config, t_q, t_k):
    query, memory = hidden(3, t_q, config.d_model, seed=1), hidden(3, t_k, config.d_model, seed=2)
    mask = reference.impl.make_padding_mask(token_ids(53, 3, t_k, pad=True), 0)  # (3, 1, 1, T_k)
    got, want = run_component(
        backend, reference, "MultiHeadAttention", config, dtype, query, memory, memory, mask, need_weights=True
    )
    assert got[1].shape == (3, config.num_heads, t_q, t_k)
    assert_close(got[0], want[0], dtype, "multi-head output")
    assert_close(got[1], want[1], dtype, "per-head weights")


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(VARIANTS["post-relu-sinusoidal"], id="bias"),
        pytest.param(VARIANTS["post-gelu_tanh-nobias"], id="nobias"),
    ],
)
def test_a_loop_of_separate_heads_equals_the_fused_layer(backend, dtype, config):
    """The tutorials' list of AttentionHead modules, given slices of the fused weights, is the same function."""
    params = init_params(config, seed=5, dtype=dtype, component="attention", nonzero_biases=True)
    fused = backend.build("MultiHeadAttention", config, params)
    looped = backend.build("MultiHeadAttentionLoop", config, attention_to_heads(params, config))
    query, memory = hidden(3, 7, config.d_model).astype(dtype), hidden(3, 11, config.d_model, seed=4).astype(dtype)
    mask = np.ones((3, 1, 7, 11), bool)
    mask[1, :, :, 6:] = False
    got_fused = backend.call(fused, query, memory, memory, mask, need_weights=True)
    got_loop = backend.call(looped, query, memory, memory, mask, need_weights=True)
    assert_close(got_loop[0], got_fused[0], dtype, "head loop vs fused output")
    assert_close(got_loop[1], got_fused[1], dtype, "head loop vs fused weights")


@pytest.mark.parametrize("config", variant_params())
def test_embeddings_match_reference(backend, reference, dtype, config):
    ids = token_ids(config.src_vocab_size, 3, 11, pad=True)
    got, want = run_component(backend, reference, "Embeddings", config, dtype, ids)
    assert_close(got, want, dtype, "embeddings")


def test_bert_style_embeddings_with_token_types_match_reference(backend, reference, dtype):
    config = Config.preset("tiny-bert")
    ids = token_ids(config.src_vocab_size, 3, 11, pad=True)
    types = (np.arange(11)[None, :] >= 5).astype(np.int64).repeat(3, 0)  # sentence A then sentence B
    got, want = run_component(backend, reference, "Embeddings", config, dtype, ids, types)
    assert_close(got, want, dtype, "BERT embeddings")


@pytest.mark.parametrize("config", variant_params())
def test_encoder_layer_matches_reference(backend, reference, dtype, config):
    mask = reference.impl.make_padding_mask(token_ids(53, 3, 11, pad=True), 0)
    got, want = run_component(
        backend, reference, "EncoderLayer", config, dtype, hidden(3, 11, config.d_model), mask, need_weights=True
    )
    assert_close(got[0], want[0], dtype, "encoder layer output")
    assert_close(got[1], want[1], dtype, "encoder layer weights")


@pytest.mark.parametrize("config", variant_params())
def test_decoder_layer_matches_reference(backend, reference, dtype, config):
    tgt = token_ids(47, 3, 7, pad=True, seed=1)
    src = token_ids(53, 3, 11, pad=True, seed=2)
    tgt_mask = reference.impl.make_decoder_mask(tgt, 0)
    memory_mask = reference.impl.make_cross_attention_mask(src, 0)
    x, memory = hidden(3, 7, config.d_model, seed=1), hidden(3, 11, config.d_model, seed=2)
    got, want = run_component(
        backend, reference, "DecoderLayer", config, dtype, x, memory, tgt_mask, memory_mask, need_weights=True
    )
    for name, g, w in zip(("output", "self weights", "cross weights"), got, want, strict=True):
        assert_close(g, w, dtype, f"decoder layer {name}")


@pytest.mark.parametrize("config", variant_params())
def test_encoder_and_decoder_stacks_match_reference(backend, reference, dtype, config):
    src = token_ids(53, 3, 11, pad=True, seed=2)
    tgt = token_ids(47, 3, 7, pad=True, seed=1)
    src_mask = reference.impl.make_padding_mask(src, 0)
    memory = hidden(3, 11, config.d_model, seed=2)
    got, want = run_component(backend, reference, "Encoder", config, dtype, memory, src_mask, True, True)
    assert len(got[1]) == config.num_encoder_layers + 1
    for g, w in zip(got[1] + got[2] + (got[0],), want[1] + want[2] + (want[0],), strict=True):
        assert_close(g, w, dtype, "encoder stack")
    got, want = run_component(
        backend,
        reference,
        "Decoder",
        config,
        dtype,
        hidden(3, 7, config.d_model, seed=1),
        memory,
        reference.impl.make_decoder_mask(tgt, 0),
        src_mask,
        True,
        True,
    )
    for g, w in zip(got[1] + got[2] + got[3] + (got[0],), want[1] + want[2] + want[3] + (want[0],), strict=True):
        assert_close(g, w, dtype, "decoder stack")


