"""Greedy and beam search on real models: with and without the key/value cache, in every backend,
against the NumPy reference. (The search algorithms themselves: test_decoding_search.py.)

Small on purpose: every (config, dtype, batch shape) is a JAX compilation, and the uncached
stepper compiles once per prefix length.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_run.data import BOS, EOS
from transformer_spec import init_params

from ..cases import VARIANTS, as_kind, token_ids
from ..tolerances import assert_close

KINDS = ("encoder_decoder", "decoder_only")
NORMS = ("post-relu-sinusoidal", "pre-gelu-learned")  # post-norm and pre-norm
STEPS = 5  # tokens generated; with seed 5 some rows of the pre-norm models emit <eos> before
BEAM = 3
SCORE_TOLERANCE = 1e-9  # beam scores, relative, float64: sums of STEPS log-probabilities


def build(backend, config, dtype="float64"):
    params = init_params(config, seed=5, dtype="float64", nonzero_biases=True)
    return backend.impl.build_model(config, {name: value.astype(dtype) for name, value in params.items()})


def sources(config, length=None):
    """A padded batch of 3: sources of real lengths 7, 4, 1, or prompts of lengths 5, 2, 1."""
    if config.kind == "encoder_decoder":
        return token_ids(config.src_vocab_size, 3, length or 7, pad=True, pad_id=config.pad_id, seed=2)
    return token_ids(config.tgt_vocab_size, 3, length or 5, pad=True, pad_id=config.pad_id, seed=2)


def up_to_eos(row):
    row = list(row)
    return row[: row.index(EOS) + 1] if EOS in row else row


@pytest.mark.parametrize(
    ("norm", "dtype"),
    [("post-relu-sinusoidal", "float64"), ("pre-gelu-learned", "float64"), ("pre-gelu-learned", "float32")],
)
@pytest.mark.parametrize("kind", KINDS)
def test_cached_and_uncached_steppers_give_the_same_logits(backend, kind, norm, dtype):
    """Step by step, fed the same tokens: the argmax, a reordering of the rows (as beam search
    does), and a padding token, which both must hide from later queries."""
    config = as_kind(VARIANTS[norm], kind)
    model = build(backend, config, dtype)
    cached, uncached = backend.impl.make_stepper(model), backend.impl.make_stepper(model, cached=False)
    src = sources(config)
    cached_state, uncached_state = cached.start(src), uncached.start(src)
    tokens = np.full(3, BOS)
    for position in range(4):
        cached_logits, cached_state = cached.step(cached_state, tokens, position)  # (3, V)
        uncached_logits, uncached_state = uncached.step(uncached_state, tokens, position)
        assert cached_logits.shape == (3, config.tgt_vocab_size) and cached_logits.dtype == dtype
        assert_close(cached_logits, uncached_logits, dtype, f"cached vs uncached logits at step {position}")
        tokens = uncached_logits.argmax(axis=-1)  # (3,)
        if position == 1:
            rows = np.array([2, 0, 0])  # drop row 1, duplicate row 0, move row 2 first
            cached_state, uncached_state = cached.reorder(cached_state, rows), uncached.reorder(uncached_state, rows)
            tokens = tokens[rows]
        if position == 2:
            tokens[1] = config.pad_id


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_cached_and_uncached_greedy_decoding_give_the_same_tokens(backend, kind, norm):
    config = as_kind(VARIANTS[norm], kind)
    model, src = build(backend, config), sources(config)
    cached = backend.impl.greedy(model, src, BOS, EOS, STEPS)
    uncached = backend.impl.greedy(model, src, BOS, EOS, STEPS, cached=False)
    assert cached.tolist() == uncached.tolist()


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_backends_decode_the_same_tokens_as_the_numpy_reference(backend, reference, kind, norm):
    """Same weights, float64: the same greedy tokens, the same beams, scores to 1e-9."""
    config = as_kind(VARIANTS[norm], kind)
    model, want_model, src = build(backend, config), build(reference, config), sources(config)
    greedy = backend.impl.greedy(model, src, BOS, EOS, STEPS)
    assert greedy.tolist() == reference.impl.greedy(want_model, src, BOS, EOS, STEPS).tolist()
    got = backend.impl.beam(model, src, BOS, EOS, STEPS, beam_size=BEAM, length_penalty=0.6)
    want = reference.impl.beam(want_model, src, BOS, EOS, STEPS, beam_size=BEAM, length_penalty=0.6)
    assert got.ids.tolist() == want.ids.tolist()
    error = float(np.max(np.abs(got.scores - want.scores) / np.abs(want.scores)))
    assert error <= SCORE_TOLERANCE, f"beam scores differ from NumPy's by {error:.2e} (relative)"


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_with_one_beam_is_greedy_search(backend, kind):
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    model, src = build(backend, config), sources(config)
    greedy = backend.impl.greedy(model, src, BOS, EOS, STEPS)
    beam = backend.impl.beam(model, src, BOS, EOS, STEPS, beam_size=1).ids
    assert any(EOS in row for row in greedy.tolist())  # some rows end early: <eos> handling is exercised
    for row in range(len(src)):
        expected = up_to_eos(greedy[row])
        assert beam[row, : len(expected)].tolist() == expected


EOS_SCALE = {"encoder_decoder": 2.0, "decoder_only": 8.0}  # eos's output column, scaled: rows end at various steps


def eos_swinging_model(kind: str):
    """A model whose <eos> logit swings with the hidden state (its output column scaled), so that
    rows end at different steps, or never, and six sources for it -> (config, params, src_ids)."""
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    params = init_params(config, seed=5, dtype="float64", nonzero_biases=True)
    weight = params["generator.proj.weight"].copy()  # (d_model, V)
    weight[:, EOS] *= EOS_SCALE[kind]
    vocab = config.src_vocab_size if kind == "encoder_decoder" else config.tgt_vocab_size
    src = token_ids(vocab, 6, 5, pad=False, pad_id=config.pad_id, seed=2)
    return config, params | {"generator.proj.weight": weight}, src


@pytest.mark.parametrize("early_stopping", [True, False, "never"], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_each_row_gets_the_beam_it_would_get_decoded_alone(backend, kind, early_stopping):
    """For each of Hugging Face's stopping rules, a row's hypothesis and score do not depend on the
    other rows of its batch. The eos column of the output projection is scaled so that the eos
    logit swings with the hidden state: rows end at different steps, or never."""
    config, params, src = eos_swinging_model(kind)
    model = backend.impl.build_model(config, params)
    steps = 8
    batched = backend.impl.beam(model, src, BOS, EOS, steps, BEAM, 2.0, early_stopping)
    ends = {len(up_to_eos(row)) if EOS in row else None for row in batched.ids.tolist()}
    assert len(ends) >= 2, f"every row ended alike ({ends}): nothing tells the rows apart"
    for row in range(len(src)):
        alone = backend.impl.beam(model, src[row : row + 1], BOS, EOS, steps, BEAM, 2.0, early_stopping)
        hypothesis = alone.ids[0].tolist()
        assert batched.ids[row, : len(hypothesis)].tolist() == hypothesis, f"row {row}"
        assert abs(batched.scores[row] - alone.scores[0]) <= SCORE_TOLERANCE * abs(alone.scores[0])


def test_a_language_model_decodes_from_bos_after_an_empty_prompt(backend):
    """Prompt of length 0: the model reads <bos>, then its own tokens; each one is the argmax of
    the model's ordinary forward pass over the sequence before it."""
    config = as_kind(VARIANTS["pre-gelu-learned"], "decoder_only")
    model = build(backend, config)
    out = backend.impl.greedy(model, np.zeros((3, 0), np.int64), BOS, EOS, STEPS)
    assert out.shape[0] == 3 and out[:, 0].tolist() == [BOS] * 3
    logits = backend.call(model, out[:, :-1]).logits  # (3, T - 1, V)
    for row in range(3):
        generated = up_to_eos(out[row])[1:]
        assert logits[row, : len(generated)].argmax(axis=-1).tolist() == generated


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
def test_decoding_past_max_len_is_refused(backend, cached):
    config = as_kind(VARIANTS["pre-gelu-learned"], "decoder_only").replace(max_len=8)
    model = build(backend, config)
    with pytest.raises(ValueError, match="max_len is 8"):
        never = config.tgt_vocab_size  # an <eos> no model emits: decoding runs on to position 5 + 5 > 8
        backend.impl.greedy(model, sources(config), BOS, never, max_len=STEPS, cached=cached)


@pytest.mark.parametrize("offset", [1, -1], ids=["a-skipped-position", "an-earlier-position"])
def test_a_growing_cache_refuses_entries_for_any_position_but_the_next(backend, offset):
    """NumPy's and torch's caches grow by concatenation: the new keys must be for the position right
    after the cached ones; one skipped or one already held would shift every later position's key.
    (JAX's cache is a buffer written at the position given; its stepper checks the bounds.)"""
    if backend.name == "jax":
        pytest.skip("JAX's cache is a fixed buffer written at any position (the stepper checks its bounds)")
    cached = backend.asarray(np.zeros((1, 2, 3, 4)))  # (B, H_kv, positions 0..2, d_k)
    new = backend.asarray(np.ones((1, 2, 1, 4)))
    grown = backend.to_numpy(backend.impl.attention.append_to_cache(cached, new, 3, axis=2))
    assert grown.shape == (1, 2, 4, 4) and (grown[:, :, 3] == 1).all()
    with pytest.raises(
        ValueError, match=f"the cache holds 3 positions, but the new entries are for position {3 + offset}"
    ):
        backend.impl.attention.append_to_cache(cached, new, 3 + offset, axis=2)


@pytest.mark.parametrize("position", [2, 3, 4], ids=["an-earlier-position", "the-next", "a-skipped-position"])
def test_a_growing_cache_grows_or_refuses_as_numpys_does(backend, reference, position):
    """NumPy's growing cache is the reference the others are held to: at every position the backend's
    ``append_to_cache`` and NumPy's both give the same grown cache or both refuse with the same message.
    The test above calls NumPy's only with --backend=numpy; this one in every run
    (numpy-cache-accepts-a-skipped-position)."""
    if backend.name == "jax":
        pytest.skip("JAX's cache is a fixed buffer written at any position (the stepper checks its bounds)")
    outcomes = []
    for side in (backend, reference):
        cached, new = side.asarray(np.zeros((1, 2, 3, 4))), side.asarray(np.ones((1, 2, 1, 4)))
        try:
            outcomes.append(side.to_numpy(side.impl.attention.append_to_cache(cached, new, position, axis=2)).tolist())
        except ValueError as error:
            outcomes.append(str(error))
    assert outcomes[0] == outcomes[1], f"{backend.name}: {outcomes[0]!r:.80}, NumPy: {outcomes[1]!r:.80}"


@pytest.mark.parametrize("kind", KINDS)
def test_each_stopping_rule_gives_the_references_beams(backend, reference, kind):
    """``early_stopping`` reaches the search in every backend: for each of Hugging Face's rules the
    backend's hypotheses and scores are NumPy's, on a model whose rows end at different steps, where
    the rules give different answers (a backend that dropped the option would give one answer)."""
    config, params, src = eos_swinging_model(kind)
    model, want_model = backend.impl.build_model(config, params), reference.impl.build_model(config, params)
    answers = set()
    for early_stopping in (True, False, "never"):
        got = backend.impl.beam(model, src, BOS, EOS, 8, BEAM, 2.0, early_stopping)
        want = reference.impl.beam(want_model, src, BOS, EOS, 8, BEAM, 2.0, early_stopping)
        assert got.ids.tolist() == want.ids.tolist(), early_stopping
        np.testing.assert_allclose(got.scores, want.scores, rtol=SCORE_TOLERANCE, err_msg=str(early_stopping))
        answers.add((str(want.ids.tolist()), tuple(np.round(want.scores, 9))))
    assert len(answers) >= 2, "every rule gave the same beams: nothing tells them apart"
