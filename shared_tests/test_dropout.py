"""Dropout: off in inference mode (the model is then exactly the dropout-free one), seeded and
reproducible in training mode, at the paper's places, with the expected keep rate and scale.

The three backends draw their masks from different generators (NumPy's PCG64, JAX's
threefry keys, torch's global Philox/MT), so masks are compared within a backend, never
across: parity runs use dropout 0 (see test_training.py)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_run.batches import split_batch
from transformer_spec import Config, init_params

from .cases import DTYPES, SHAPES, TINY, as_kind, model_inputs
from .tolerances import assert_close

KINDS = ("encoder_decoder", "decoder_only", "encoder_only")


def _model(backend, config, dtype="float64"):
    return backend.impl.build_model(config, init_params(config, seed=0, dtype=dtype, nonzero_biases=True))


def _run(backend, model, config):
    out = backend.call(model, *model_inputs(config, SHAPES["padded-3x11x7"]))
    return out.logits if config.uses_decoder else out.last_hidden_state


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inference_mode_is_the_model_without_dropout(backend, reference, kind, dtype):
    """build_model gives inference mode: with dropout 0.3 the output is the dropout-0 reference's."""
    config = as_kind(TINY, kind)
    want = _run(reference, _model(reference, config), config)
    got = _run(backend, _model(backend, config.replace(dropout=0.3), dtype), config)
    assert_close(got, want, dtype, "eval-mode output with dropout 0.3")


@pytest.mark.parametrize("kind", KINDS)
def test_training_mode_masks_are_random_and_reproducible_from_the_seed(backend, kind):
    config = as_kind(TINY.replace(dropout=0.3), kind)
    model = _model(backend, config)
    inference = _run(backend, model, config)
    model.train()
    backend.impl.seed_dropout(model, 5)
    first, second = _run(backend, model, config), _run(backend, model, config)
    backend.impl.seed_dropout(model, 5)
    again = _run(backend, model, config)
    backend.impl.seed_dropout(model, 6)
    other_seed = _run(backend, model, config)
    assert np.array_equal(first, again), "the same seed must give the same masks"
    assert not np.allclose(first, second), "each call draws new masks"
    assert not np.allclose(first, other_seed), "another seed, other masks"
    assert not np.allclose(first, inference), "training mode drops"
    model.eval()
    assert np.array_equal(_run(backend, model, config), inference), "eval() switches dropout off again"


def test_jax_jitted_call_draws_new_masks_each_time():
    """Plain jax.jit would drop the random stream's counter update and repeat one mask
    forever; the model's __call__ uses nnx.jit while dropout is active."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from jax_impl import build_model, seed_dropout

    config = TINY.replace(dropout=0.3)
    model = build_model(config, init_params(config, seed=0))
    model.train()
    seed_dropout(model, 0)
    src, tgt = (jnp.asarray(x) for x in model_inputs(config, SHAPES["batch1"]))
    first, second = model(src, tgt).logits, model(src, tgt).logits
    assert not np.allclose(np.asarray(first), np.asarray(second))
    seed_dropout(model, 0)
    assert np.array_equal(np.asarray(model(src, tgt).logits), np.asarray(first))  # jit or not: the same masks


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_keeps_one_minus_rate_and_scales_the_kept_by_its_inverse(backend, rate):
    dropout = backend.impl.Dropout(rate)
    x = np.ones((200, 500))
    backend.impl.seed_dropout(dropout, 3)
    y = backend.call(dropout, x)
    kept = y != 0
    assert np.allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-12)
    fraction = kept.mean()  # 100000 draws: the standard deviation of the fraction is <= 0.0016
    assert abs(fraction - (1.0 - rate)) < 0.01, fraction


def test_no_two_layers_share_a_mask(backend):
    """Each Dropout has its own stream: the two sub-layer dropouts of one layer, fed the same
    input, drop different elements."""
    config = TINY.replace(dropout=0.5)
    model = _model(backend, config)
    model.train()
    backend.impl.seed_dropout(model, 0)
    layer = model.encoder.layers[0]
    x = np.ones((2, 7, config.d_model))
    a = backend.call(layer.self_attn_dropout, x)
    b = backend.call(layer.ffn_dropout, x)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("rate", [-0.1, 1.0, True, "0.1"])
def test_dropout_outside_0_1_is_a_config_error(rate):
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
        Config.preset("tiny", dropout=rate)


def test_train_trains_with_dropout_and_leaves_inference_mode(backend):
    """A whole run with dropout 0.1: the loss falls, and the model comes back in inference mode
    (its outputs then repeat exactly)."""
    from transformer_run.data import copy_task
    from transformer_run.schedules import constant_schedule

    config = TINY.replace(src_vocab_size=12, tgt_vocab_size=12, dropout=0.1, norm_first=True)
    model = _model(backend, config, "float32")
    batches = [copy_task(16, 5, 12, seed=s) for s in range(4)]
    losses = backend.impl.train(model, batches, 40, constant_schedule(3e-3), seed=1)
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    inputs, _ = split_batch(config, batches[0])
    first, second = backend.call(model, *inputs).logits, backend.call(model, *inputs).logits
    assert np.array_equal(first, second)
