"""Properties every backend must have, checked in each backend on its own outputs."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import init_params

from .cases import VARIANTS, as_kind, hidden, token_ids
from .tolerances import assert_close

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
