"""Properties every attention must have, checked in each backend on its own outputs (masked
keys get no weight, a query with nothing to attend to gets zeros, the masks' shapes, cross
attention's lengths); and attentions drawn at random by hypothesis, against the reference.

Apart from ``test_components.py``, whose every test runs at each dtype: these choose theirs."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from transformer_spec import init_params

from ..cases import VARIANTS, hidden
from ..helpers import attention_cases, cast_params, check_close, hypothesis_settings

# ------------------------------------------------------------------ properties
DTYPE = "float64"  # properties are exact in real arithmetic: test them where rounding is smallest


def test_attention_rows_sum_to_one_over_allowed_keys_and_masked_keys_get_zero(backend):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7, 6))
    mask = rng.random((2, 1, 5, 7)) < 0.5
    mask[..., 2] = True
    _, weights = backend.call(backend.impl.scaled_dot_product_attention, q, k, v, mask)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=0, atol=1e-14)
    assert np.all(weights[np.broadcast_to(~mask, weights.shape)] == 0.0)  # exactly zero, not exp(-1e9)


def test_a_query_with_no_allowed_key_gets_zero_output_and_zero_weights(backend):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    mask = np.ones((1, 1, 3, 5), bool)
    mask[0, 0, 1, :] = False  # query 1 may look at nothing
    output, weights = backend.call(backend.impl.scaled_dot_product_attention, q, k, v, mask)
    assert np.all(np.isfinite(output)) and np.all(np.isfinite(weights))
    assert np.all(weights[:, :, 1] == 0.0) and np.all(output[:, :, 1] == 0.0)
    np.testing.assert_allclose(weights[:, :, [0, 2]].sum(-1), 1.0, atol=1e-14)


def test_causal_mask_is_lower_triangular_and_padding_mask_hides_pad_keys(backend):
    ids = np.array([[5, 6, 7, 0], [8, 0, 0, 0]])
    causal = backend.to_numpy(backend.impl.make_causal_mask(4))
    assert causal.shape == (1, 1, 4, 4) and causal.dtype == bool
    assert np.array_equal(causal[0, 0], np.tril(np.ones((4, 4), bool)))
    padding = backend.call(backend.impl.make_padding_mask, ids, 0)
    assert padding.shape == (2, 1, 1, 4) and np.array_equal(padding[:, 0, 0], ids != 0)
    decoder = backend.call(backend.impl.make_decoder_mask, ids, 0)
    assert decoder.shape == (2, 1, 4, 4)
    assert np.array_equal(decoder, padding & causal)
    cross = backend.call(backend.impl.make_cross_attention_mask, ids, 0)
    assert np.array_equal(cross, padding)


def test_multi_head_attention_handles_cross_attention_lengths(backend):
    config = VARIANTS["post-relu-sinusoidal"]
    attention = backend.build("MultiHeadAttention", config, init_params(config, dtype=DTYPE, component="attention"))
    out, weights = backend.call(
        attention, hidden(2, 3, 36), hidden(2, 8, 36, seed=3), hidden(2, 8, 36, seed=3), None, need_weights=True
    )
    assert out.shape == (2, 3, 36) and weights.shape == (2, 3, 3, 8)


# ------------------------------------------------------------------ random cases, drawn by hypothesis
@hypothesis_settings(max_examples=8)
@given(case=attention_cases(), seed=st.integers(0, 2**10))
def test_random_attention_under_random_masks_gives_the_references_output_and_weights(backend, reference, case, seed):
    config, dtype, batch, t_q, t_k, mask = case
    params = init_params(config, seed=seed, dtype="float64", component="attention", nonzero_biases=True)
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((batch, t_q, config.d_model))
    key, value = rng.standard_normal((2, batch, t_k, config.d_model))
    want = reference.call(reference.build("MultiHeadAttention", config, params), query, key, value, mask, True)
    attention = backend.build("MultiHeadAttention", config, cast_params(params, dtype))
    inputs = (x.astype(dtype) for x in (query, key, value))
    got = backend.call(attention, *inputs, mask, True)
    for name, g, w in zip(("output", "weights"), got, want, strict=True):
        assert g.dtype == dtype
        check_close(g, w, dtype, 1, f"attention {name} of {config} with a mask of shape {getattr(mask, 'shape', None)}")
    if mask is not None:  # masked keys get exactly zero weight, not exp(-1e9)
        assert np.all(got[1][np.broadcast_to(~mask, got[1].shape)] == 0.0)

    # the bare function: q, k, v of any leading dims, d_v != d_k
    q = rng.standard_normal((batch, config.num_heads, t_q, config.d_k))
    k = rng.standard_normal((batch, config.num_heads, t_k, config.d_k))
    v = rng.standard_normal((batch, config.num_heads, t_k, config.d_k + 1))
    want = reference.call(reference.impl.scaled_dot_product_attention, q, k, v, mask)
    got = backend.call(backend.impl.scaled_dot_product_attention, *(x.astype(dtype) for x in (q, k, v)), mask)
    for name, g, w in zip(("context", "weights"), got, want, strict=True):
        check_close(g, w, dtype, 1, f"scaled_dot_product_attention {name}")
