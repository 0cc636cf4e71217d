"""Tests written for the realistic bugs that survived the rest of the suite (``python -m
tools.mutants``): each names the mutant(s) of ``tools/mutant_list.py`` it kills.

Dropout across backends: the three backends draw their masks from different generators, so
the rest of the suite checks dropout within a backend only and never where it sits. Here
every backend's Dropout is replaced (for the test's duration) by one whose mask is a fixed
function of the input's shape, the same in every backend: a training-mode forward pass and
its gradients must then be NumPy's, which places dropout where the paper does (section 5.4).
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest

from transformer_run.batches import split_batch
from transformer_run.decoding import beam_search
from transformer_spec import init_params

from .cases import SHAPES, TINY, as_kind, model_inputs
from .test_converters import exported
from .test_decoding_search import BOS, VOCAB, MarkovStepper, sequence_log_prob
from .test_gradients import training_batch
from .tolerances import assert_close, assert_loss_and_gradients_match

KINDS = ("encoder_decoder", "decoder_only", "encoder_only")


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


# ------------------------------------------------------------------ beam search, nothing finished
@pytest.mark.parametrize("length_penalty", [0.0, 0.7, 1.0])
def test_beam_search_with_no_finished_hypothesis_returns_the_best_running_one_length_normalised(length_penalty):
    """eos=None: no hypothesis ever finishes, so the answer is the best running one, scored as a
    finished one would be: log-probability / (generated length ** length_penalty). A beam of 16
    holds every prefix of the 4 possible tokens, so the search is exact (brute force agrees).
    Kills spec-beam-unfinished-not-length-normalised and spec-beam-length-counts-bos."""
    stepper, src, max_len = MarkovStepper(seed=5), np.array([[0], [1], [2]]), 3
    result = beam_search(stepper, src, BOS, None, max_len=max_len, beam_size=16, length_penalty=length_penalty)
    for row in range(3):
        candidates = [[BOS, *body] for body in itertools.product(range(2, VOCAB), repeat=max_len)]
        log_probs = [sequence_log_prob(stepper, row, hypothesis) for hypothesis in candidates]
        best = int(np.argmax(log_probs))
        assert result.ids[row].tolist() == candidates[best]
        assert abs(result.scores[row] - log_probs[best] / max_len**length_penalty) < 1e-12


# ------------------------------------------------------------------ the loss's pad id
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_loss_skips_the_configured_pad_id_not_token_0(backend, label_smoothing):
    """pad_id 3: targets equal to 3 do not count, targets equal to 0 (a real token here) do.
    Every other loss test pads with 0, so a hard-coded 0 passed them (torch-loss-pad-id-zero,
    numpy-loss-counts-padding)."""
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((2, 5, 11)) * 3.0
    targets = np.array([[0, 4, 0, 3, 3], [5, 0, 3, 3, 3]])
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    per_token = -(1 - label_smoothing) * np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    per_token -= label_smoothing * log_probs.mean(-1)
    want = per_token[targets != 3].mean()  # 5 real targets, three of them token 0
    got = backend.call(backend.impl.cross_entropy, logits, targets, 3, label_smoothing)
    assert_close(got, want, "float64", "cross-entropy with pad_id 3")


# ------------------------------------------------------------------ converters' key mapping
# Their name -> (our name, how their tensor is laid out from ours), as the converters' docstrings
# and the real libraries have them (nn.Linear stores [out, in]; GPT-2's Conv1D [in, out], with
# c_attn = [q | k | v] side by side). Layer 0 of each; the round trip of test_converters.py
# cannot see two names exchanged in both directions.
D = 36  # the GPT-2 converter's d_model in test_converters.py
PINNED = {
    "BertModel": {
        "encoder.layer.0.attention.output.LayerNorm.weight": ("encoder.layers.0.self_attn_norm.weight", None),
        "encoder.layer.0.output.LayerNorm.weight": ("encoder.layers.0.ffn_norm.weight", None),
        "encoder.layer.0.attention.self.key.weight": ("encoder.layers.0.self_attn.w_k.weight", np.transpose),
        "encoder.layer.0.output.dense.weight": ("encoder.layers.0.ffn.w_2.weight", np.transpose),
    },
    "LlamaForCausalLM": {
        "model.layers.0.self_attn.k_proj.weight": ("decoder.layers.0.self_attn.w_k.weight", np.transpose),
        "model.layers.0.self_attn.v_proj.weight": ("decoder.layers.0.self_attn.w_v.weight", np.transpose),
        "model.layers.0.mlp.gate_proj.weight": ("decoder.layers.0.ffn.w_gate.weight", np.transpose),
        "model.layers.0.input_layernorm.weight": ("decoder.layers.0.self_attn_norm.weight", None),
    },
    "GPT2LMHeadModel": {
        "transformer.h.0.attn.c_attn.weight": ("decoder.layers.0.self_attn.w_q.weight", lambda w: w[:, :D]),
        "transformer.h.0.attn.c_attn.bias": ("decoder.layers.0.self_attn.w_k.bias", lambda b: b[D : 2 * D]),
        "transformer.h.0.ln_2.weight": ("decoder.layers.0.ffn_norm.weight", None),
    },
}


@pytest.mark.parametrize("name", list(PINNED))
def test_their_names_hold_the_tensors_the_libraries_give_them(name):
    """Kills spec-bert-norm-names-swapped, spec-llama-k-v-swapped, spec-gpt2-qkv-order."""
    converter, params, state = exported(name)
    for theirs, (ours, cut) in PINNED[name].items():
        tensor = state[theirs] if cut is None else cut(state[theirs])
        assert np.array_equal(tensor, params[ours]), f"{theirs} does not hold our {ours}"
    back = converter.from_theirs(state, converter.config)
    assert all(np.array_equal(back[k], params[k]) for k in params)
