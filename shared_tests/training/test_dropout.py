"""Dropout: off in inference mode (the model is then exactly the dropout-free one), seeded and
reproducible in training mode, at the paper's places, with the expected keep rate and scale.

The three backends draw their masks from different generators (NumPy's PCG64, JAX's
threefry keys, torch's global Philox/MT), so masks are compared within a backend, never
across: parity runs use dropout 0 (see test_training.py)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from transformer_run.batches import split_batch
from transformer_spec import Config, init_params

from ..cases import DTYPES, SHAPES, TINY, as_kind, model_inputs
from ..helpers import training_batch
from ..tolerances import assert_close, assert_loss_and_gradients_match

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


# ------------------------------------------------------------------ dropout under fixed masks
def fixed_keep(shape: tuple[int, ...], rate: float) -> np.ndarray:
    """The mask every backend draws for an input of ``shape``: True with probability 1 - rate."""
    return np.random.default_rng([len(shape), *shape]).random(shape) >= rate


@contextlib.contextmanager
def fixed_dropout_masks(backend_name: str, impl):
    """Every Dropout of ``impl`` draws ``fixed_keep`` masks; JAX runs eagerly (a compiled forward
    pass cached by an earlier test would keep its own random masks)."""
    cls = impl.Dropout
    if backend_name == "numpy":

        def numpy_call(self, x):
            if not self.training or self.rate == 0:
                self.keep(multiplier=None)
                return x
            multiplier = fixed_keep(x.shape, self.rate).astype(x.dtype) / (1.0 - self.rate)
            self.keep(multiplier=multiplier)  # what the hand-written backward reads
            return x * multiplier

        method, replacement, context = "__call__", numpy_call, contextlib.nullcontext()
    elif backend_name == "torch":
        import torch

        def torch_forward(self, x):
            if not self.training or self.rate == 0:
                return x
            multiplier = fixed_keep(tuple(x.shape), self.rate) / (1.0 - self.rate)  # float64, as NumPy's
            return x * torch.as_tensor(multiplier, dtype=x.dtype, device=x.device)

        method, replacement, context = "forward", torch_forward, contextlib.nullcontext()
    else:
        import jax
        import jax.numpy as jnp

        def jax_call(self, x):
            if self.deterministic or self.rate == 0:
                return x
            multiplier = fixed_keep(tuple(x.shape), self.rate) / (1.0 - self.rate)
            return x * jnp.asarray(multiplier, x.dtype)

        method, replacement, context = "__call__", jax_call, jax.disable_jit()
    original = cls.__dict__[method]
    setattr(cls, method, replacement)
    try:
        with context:
            yield
    finally:
        setattr(cls, method, original)


def _training_model(backend, config):
    model = backend.impl.build_model(config, init_params(config, seed=3, dtype="float64", nonzero_biases=True))
    model.train()
    return model


def _output(backend, model, config):
    out = backend.call(model, *model_inputs(config, SHAPES["padded-3x11x7"]))
    return out.logits if config.uses_decoder else out.last_hidden_state


DROPOUT_CONFIGS = {
    "post-norm": TINY.replace(dropout=0.3),
    "pre-norm": TINY.replace(dropout=0.3, norm_first=True),
    "modern": TINY.replace(  # RMSNorm, gated feed-forward, rotary positions, grouped-query attention
        dropout=0.3, norm_first=True, norm="rms_norm", gated_ffn=True, activation="silu", positional="rotary",
        num_kv_heads=1, bias=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("config", [pytest.param(c, id=n) for n, c in DROPOUT_CONFIGS.items()])
@pytest.mark.parametrize("kind", KINDS)
def test_dropout_sits_where_numpys_does_under_the_same_fixed_masks(backend_name, backend, reference, kind, config):
    """Training mode, the same masks in every backend: the output is NumPy's. Dropout after the
    residual addition (torch-prenorm-dropout-after-residual, jax-postnorm-dropout-after-residual,
    numpy-prenorm-dropout-after-residual), after W_2 (torch-ffn-dropout-after-output-projection)
    or missing from the attention weights (jax-attention-dropout-on-context) changes it."""
    config = as_kind(config, kind)
    with fixed_dropout_masks("numpy", reference.impl):
        model = _training_model(reference, config)
        want = _output(reference, model, config)
        model.eval()
        inference = _output(reference, model, config)
    assert not np.allclose(want, inference), "the fixed masks must drop something"
    with fixed_dropout_masks(backend_name, backend.impl):
        model = _training_model(backend, config)
        got = _output(backend, model, config)
        assert np.array_equal(got, _output(backend, model, config)), "fixed masks: the same output twice"
    assert_close(got, want, "float64", f"{kind} training-mode output under fixed dropout masks")


@pytest.mark.parametrize("config", [pytest.param(c, id=n) for n, c in DROPOUT_CONFIGS.items()])
@pytest.mark.parametrize("kind", ("encoder_decoder", "decoder_only"))
def test_dropout_gradients_match_numpys_under_the_same_fixed_masks(backend_name, backend, reference, kind, config):
    """The loss and every gradient in training mode with the same masks: NumPy's hand-written
    backward (its dropout multipliers kept by the forward) against torch's and JAX's autograd."""
    config = as_kind(config, kind)
    batch = training_batch(config)
    with fixed_dropout_masks("numpy", reference.impl):
        want = reference.impl.loss_and_grads(_training_model(reference, config), batch, 0.1)
    with fixed_dropout_masks(backend_name, backend.impl):
        got = backend.impl.loss_and_grads(_training_model(backend, config), batch, 0.1)
    assert_loss_and_gradients_match(got, want, f"{kind} under fixed dropout masks")
    inputs, targets = split_batch(config, batch)
    eval_model = reference.impl.build_model(config, init_params(config, seed=3, dtype="float64", nonzero_biases=True))
    eval_loss = float(reference.impl.cross_entropy(eval_model(*inputs).logits, targets, config.pad_id, 0.1))
    assert eval_loss != pytest.approx(want[0], rel=1e-6), "the fixed masks must change the loss"
