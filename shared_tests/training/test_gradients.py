"""Gradients: NumPy's hand-written backward passes against finite differences, then every
backend's ``loss_and_grads`` (torch.autograd, jax.grad) against NumPy's, in float64.

The finite-difference checks run on the NumPy reference alone (the other backends have
autograd); each perturbs one coordinate of an array in place, re-runs the forward pass,
and compares (f(x + h) - f(x - h)) / 2h with the backward's gradient at that coordinate.
A component's scalar loss is sum(output * R) for a fixed random R, so that R is its
grad_output. Tolerances: ``tolerances.GRADIENT_TOLERANCE``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from numpy_impl.attention import masked_softmax_backward, scaled_dot_product_attention_backward
from numpy_impl.feed_forward import ACTIVATION_BACKWARDS
from numpy_impl.loss import cross_entropy_backward
from numpy_impl.module import enable_grad
from transformer_run.batches import decoder_only_batch, encoder_decoder_batch, shift_targets, split_batch
from transformer_spec import Config, init_params, param_schema, parent_of

from ..cases import SHARED, TINY, VARIANTS, as_kind, hidden, token_ids, variant_params
from ..helpers import (
    STEP,
    build,
    central_difference,
    check_finite_differences,
    check_model_against_finite_differences,
    module_arrays,
    output_weights,
    training_batch,
)
from ..tolerances import assert_close, assert_loss_and_gradients_match, assert_matches_finite_differences

DECODER_KINDS = ("encoder_decoder", "decoder_only")
PRE_AND_POST_NORM = [
    pytest.param(VARIANTS["post-relu-sinusoidal"], id="post-relu"),
    pytest.param(VARIANTS["pre-gelu-learned"], id="pre-gelu"),
    pytest.param(VARIANTS["post-gelu_tanh-nobias"], id="post-gelu_tanh-nobias"),
]



# ------------------------------------------------------------------ elementwise and functional pieces
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_activation_backward_matches_finite_differences(reference, activation):
    forward, backward = getattr(reference.impl, activation), ACTIVATION_BACKWARDS[activation]
    x = np.random.default_rng(0).standard_normal(301) * 3.0
    x = x[np.abs(x) > 1e-3]  # not within a step of relu's kink
    # elementwise: the whole derivative at once, d f(x_i) / d x_i
    numeric = (forward(x + STEP) - forward(x - STEP)) / (2 * STEP)
    analytic = backward(x, np.ones_like(x))
    assert_matches_finite_differences(analytic, numeric, float(np.abs(analytic).max()), activation)


def test_activation_derivatives_at_zero(reference):
    zero, one = np.zeros(1), np.ones(1)
    assert ACTIVATION_BACKWARDS["relu"](zero, one)[0] == 0.0  # as torch: the kink's gradient is 0
    assert ACTIVATION_BACKWARDS["gelu"](zero, one)[0] == 0.5  # Phi(0) + 0 * phi(0)
    assert ACTIVATION_BACKWARDS["gelu_tanh"](zero, one)[0] == 0.5


def test_masked_softmax_backward_matches_finite_differences_and_is_zero_on_a_fully_masked_row(reference):
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((2, 3, 5, 7))  # (B, H, T_q, T_k)
    mask = rng.random((2, 1, 5, 7)) < 0.6
    mask[:, :, :, 0] = True
    mask[1, :, 2, :] = False  # one query row with no key at all
    r = output_weights(scores.shape)
    weights = reference.impl.masked_softmax(scores, mask)
    grad = masked_softmax_backward(weights, r)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[1, :, 2, :] == 0.0), "a fully masked row has a constant (zero) output: zero gradient"
    assert np.all(grad[np.broadcast_to(~mask, grad.shape)] == 0.0), "masked keys get no gradient"
    loss = lambda: float((reference.impl.masked_softmax(scores, mask) * r).sum())
    check_finite_differences("masked softmax", loss, {"scores": scores}, {"scores": grad}, full_up_to=scores.size)


def test_scaled_dot_product_attention_backward_matches_finite_differences(reference):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 2, 4, 5)), rng.standard_normal((3, 2, 6, 5)), rng.standard_normal((3, 2, 6, 3))
    mask = rng.random((3, 1, 4, 6)) < 0.7
    mask[0, :, 1, :] = False  # a fully masked query row
    context, weights = reference.impl.scaled_dot_product_attention(q, k, v, mask)
    r = output_weights(context.shape)
    grad_q, grad_k, grad_v = scaled_dot_product_attention_backward(q, k, v, weights, r)
    loss = lambda: float((reference.impl.scaled_dot_product_attention(q, k, v, mask)[0] * r).sum())
    arrays, analytic = {"q": q, "k": k, "v": v}, {"q": grad_q, "k": grad_k, "v": grad_v}
    check_finite_differences("attention", loss, arrays, analytic, full_up_to=200)


def test_tiled_attention_backward_matches_finite_differences(reference):
    """FlashAttention's backward (the weights recomputed block by block from the logsumexp), with
    blocks that do not divide the keys and a fully masked query row."""
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 2, 4, 5)), rng.standard_normal((2, 2, 7, 5)), rng.standard_normal((2, 2, 7, 3))
    mask = rng.random((2, 1, 4, 7)) < 0.7
    mask[1, :, 2, :] = False  # a fully masked query row
    attention = reference.impl.TiledAttention(block_size=3)
    with enable_grad():
        context = attention(q, k, v, mask)
    r = output_weights(context.shape)
    (grad_q, grad_k, grad_v), _ = attention.backward(r)
    loss = lambda: float((attention(q, k, v, mask) * r).sum())
    arrays, analytic = {"q": q, "k": k, "v": v}, {"q": grad_q, "k": grad_k, "v": grad_v}
    check_finite_differences("tiled attention", loss, arrays, analytic, full_up_to=200)


def test_linear_backward_matches_finite_differences(reference):
    rng = np.random.default_rng(2)
    linear = reference.impl.Linear(7, 4, bias=True, dtype="float64")
    linear.weight[...], linear.bias[...] = rng.standard_normal((7, 4)), rng.standard_normal(4)
    x = rng.standard_normal((3, 5, 7))
    with enable_grad():  # the modules keep what their backward needs
        output = linear(x)
    r = output_weights(output.shape)
    grad_x, grads = linear.backward(r)
    loss = lambda: float((linear(x) * r).sum())
    arrays = {"x": x, "weight": linear.weight, "bias": linear.bias}
    check_finite_differences("linear", loss, arrays, {"x": grad_x} | grads, full_up_to=200)


@pytest.mark.parametrize("eps", [1e-5, 1e-12])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_backward_matches_finite_differences(reference, eps, bias):
    config = TINY.replace(layer_norm_eps=eps, bias=bias)
    norm, schema = build(reference, "LayerNorm", config)
    x = hidden(3, 7, config.d_model) * 2.0 + 3.0
    with enable_grad():  # the modules keep what their backward needs
        output = norm(x)
    r = output_weights(output.shape)
    grad_x, grads = norm.backward(r)
    loss = lambda: float((norm(x) * r).sum())
    arrays = {"x": x} | module_arrays(norm, schema, config)
    check_finite_differences("layer norm", loss, arrays, {"x": grad_x} | grads)


@pytest.mark.parametrize("config", variant_params())
def test_feed_forward_backward_matches_finite_differences(reference, config):
    ffn, schema = build(reference, "PositionwiseFeedForward", config)
    x = hidden(3, 5, config.d_model)
    with enable_grad():  # the modules keep what their backward needs
        output = ffn(x)
    r = output_weights(output.shape)
    grad_x, grads = ffn.backward(r)
    loss = lambda: float((ffn(x) * r).sum())
    arrays = {"x": x} | module_arrays(ffn, schema, config)
    check_finite_differences(f"feed-forward ({config.activation})", loss, arrays, {"x": grad_x} | grads)


# ------------------------------------------------------------------ attention layers
@pytest.mark.parametrize(
    "config",
    [
        pytest.param(VARIANTS["post-relu-sinusoidal"], id="bias"),
        pytest.param(VARIANTS["post-gelu_tanh-nobias"], id="nobias"),
    ],
)
def test_cross_attention_backward_matches_finite_differences(reference, config):
    """Queries (B, 7, d) over keys and values (B, 11, d): T_q != T_k, key padding masked."""
    attention, schema = build(reference, "MultiHeadAttention", config)
    query, key, value = (
        hidden(3, 7, config.d_model, seed=1),
        hidden(3, 11, config.d_model, seed=2),
        hidden(3, 11, config.d_model, seed=3),
    )
    mask = reference.impl.make_padding_mask(token_ids(53, 3, 11, pad=True), 0)  # (3, 1, 1, 11)
    with enable_grad():  # the modules keep what their backward needs
        (output, _) = attention(query, key, value, mask)
    r = output_weights(output.shape)
    (grad_query, grad_key, grad_value), grads = attention.backward(r)
    loss = lambda: float((attention(query, key, value, mask)[0] * r).sum())
    arrays = {"query": query, "key": key, "value": value} | module_arrays(attention, schema, config)
    analytic = {"query": grad_query, "key": grad_key, "value": grad_value} | grads
    check_finite_differences("cross-attention", loss, arrays, analytic)


def test_self_attention_backward_matches_finite_differences(reference):
    """One x as query, key and value, under a causal + padding mask: x's gradient sums the three paths."""
    config = VARIANTS["pre-gelu-learned"]
    attention, schema = build(reference, "MultiHeadAttention", config)
    x = hidden(3, 7, config.d_model)
    mask = reference.impl.make_decoder_mask(token_ids(47, 3, 7, pad=True), 0)  # (3, 1, 7, 7)
    with enable_grad():  # the modules keep what their backward needs
        (output, _) = attention(x, x, x, mask)
    r = output_weights(output.shape)
    grad_x, grads = attention.self_attention_backward(r)
    loss = lambda: float((attention(x, x, x, mask)[0] * r).sum())
    arrays = {"x": x} | module_arrays(attention, schema, config)
    check_finite_differences("self-attention", loss, arrays, {"x": grad_x} | grads)


# ------------------------------------------------------------------ embeddings
@pytest.mark.parametrize("config", variant_params())
def test_embeddings_backward_matches_finite_differences(reference, config):
    """Token (scaled or not) + sinusoidal, learned or no positions; at an offset, so the learned
    table's gradient must land on rows 3..13."""
    embeddings, schema = build(reference, "Embeddings", config)
    ids = token_ids(config.src_vocab_size, 3, 11, pad=True)
    with enable_grad():  # the modules keep what their backward needs
        output = embeddings(ids, None, 3)
    r = output_weights(output.shape)
    _, grads = embeddings.backward(r)
    if config.positional == "learned":
        assert np.all(grads["position.weight"][:3] == 0) and np.all(grads["position.weight"][14:] == 0)
    loss = lambda: float((embeddings(ids, None, 3) * r).sum())
    check_finite_differences(
        f"embeddings ({config.positional})", loss, module_arrays(embeddings, schema, config), grads
    )


def test_bert_embeddings_with_token_types_and_norm_backward_matches_finite_differences(reference):
    config = Config.preset("tiny-bert")
    embeddings, schema = build(reference, "Embeddings", config)
    ids = token_ids(config.src_vocab_size, 3, 11, pad=True)
    types = (np.arange(11)[None, :] >= 5).astype(np.int64).repeat(3, 0)  # sentence A then sentence B
    with enable_grad():  # the modules keep what their backward needs
        output = embeddings(ids, types)
    r = output_weights(output.shape)
    _, grads = embeddings.backward(r)
    loss = lambda: float((embeddings(ids, types) * r).sum())
    check_finite_differences("BERT embeddings", loss, module_arrays(embeddings, schema, config), grads)


# ------------------------------------------------------------------ layers
@pytest.mark.parametrize("config", PRE_AND_POST_NORM)
def test_encoder_layer_backward_matches_finite_differences(reference, config):
    layer, schema = build(reference, "EncoderLayer", config)
    x = hidden(3, 11, config.d_model)
    mask = reference.impl.make_padding_mask(token_ids(53, 3, 11, pad=True), 0)
    with enable_grad():  # the modules keep what their backward needs
        (output, _) = layer(x, mask)
    r = output_weights(output.shape)
    grad_x, grads = layer.backward(r)
    loss = lambda: float((layer(x, mask)[0] * r).sum())
    arrays = {"x": x} | module_arrays(layer, schema, config)
    check_finite_differences("encoder layer", loss, arrays, {"x": grad_x} | grads)


@pytest.mark.parametrize("kind", DECODER_KINDS)
@pytest.mark.parametrize("config", PRE_AND_POST_NORM)
def test_decoder_layer_backward_matches_finite_differences(reference, config, kind):
    """With cross-attention over a (B, 11, d) memory (its gradient too), and without (decoder-only)."""
    config = as_kind(config, kind)
    layer, schema = build(reference, "DecoderLayer", config)
    x, memory = hidden(3, 7, config.d_model, seed=1), None
    tgt_mask = reference.impl.make_decoder_mask(token_ids(47, 3, 7, pad=True, seed=1), 0)
    memory_mask = None
    if config.decoder_has_cross_attention:
        memory = hidden(3, 11, config.d_model, seed=2)
        memory_mask = reference.impl.make_cross_attention_mask(token_ids(53, 3, 11, pad=True, seed=2), 0)
    with enable_grad():  # the modules keep what their backward needs
        (output, _, _) = layer(x, memory, tgt_mask, memory_mask)
    r = output_weights(output.shape)
    (grad_x, grad_memory), grads = layer.backward(r)
    loss = lambda: float((layer(x, memory, tgt_mask, memory_mask)[0] * r).sum())
    arrays, analytic = {"x": x} | module_arrays(layer, schema, config), {"x": grad_x} | grads
    if memory is None:
        assert grad_memory is None
    else:
        arrays["memory"], analytic["memory"] = memory, grad_memory
    check_finite_differences("decoder layer", loss, arrays, analytic)


# ------------------------------------------------------------------ loss and whole models
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy_backward_matches_finite_differences(reference, label_smoothing):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 7, 11)) * 3.0
    targets = token_ids(11, 3, 7, pad=True)  # rows 1 and 2 end in padding (pad_id 0)
    grad = cross_entropy_backward(logits, targets, 0, label_smoothing)
    assert np.all(grad[targets == 0] == 0.0), "padding targets contribute nothing"
    loss = lambda: float(reference.impl.cross_entropy(logits, targets, 0, label_smoothing))
    check_finite_differences("cross-entropy", loss, {"logits": logits}, {"logits": grad}, full_up_to=logits.size)



@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_model_loss_gradients_match_finite_differences(reference, kind, config, label_smoothing):
    """Every parameter of the whole model, through cross-entropy over a padded batch; the tied
    variant's target table collects gradient from the lookup and the output projection."""
    config = as_kind(config, kind)
    check_model_against_finite_differences(reference, config, training_batch(config), label_smoothing)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_model_gradients_with_dropout_match_finite_differences_under_fixed_masks(reference, kind, norm_first):
    """Training mode with dropout 0.3 at all four places (embeddings, attention weights, the
    feed-forward hidden layer, sub-layer outputs): reseeding before every evaluation holds
    the masks fixed, and the loss is then a smooth function of the weights."""
    config = as_kind(TINY.replace(dropout=0.3, norm_first=norm_first), kind)
    model = reference.impl.build_model(config, init_params(config, seed=11, dtype="float64", nonzero_biases=True))
    model.train()
    batch = training_batch(config)
    reference.impl.seed_dropout(model, 4)
    loss_value, grads = reference.impl.loss_and_grads(model, batch)
    inputs, targets = split_batch(config, batch)

    def loss():
        reference.impl.seed_dropout(model, 4)  # the same masks as the analytic gradient's
        return float(reference.impl.cross_entropy(model(*inputs).logits, targets, config.pad_id))

    assert loss() == pytest.approx(loss_value, rel=1e-12)
    model.eval()
    assert loss() != pytest.approx(loss_value, rel=1e-6), "dropout 0.3 must change the loss"
    model.train()
    arrays = {name: getattr(*parent_of(model, name)) for name in grads}
    check_finite_differences(f"{config.kind} model, dropout", loss, arrays, grads, full_up_to=0, samples=2)


def fully_masked_batch(config: Config) -> dict[str, np.ndarray]:
    """Source row 1 is all padding (its encoder and cross-attention rows have no key at all);
    target row 2 is left-padded (its first query has no key, yet a real target)."""
    batch = training_batch(config)
    batch["src_ids"][1, :] = config.pad_id
    batch["tgt_in"][2, :] = batch["tgt_in"][0]
    batch["tgt_in"][2, 0] = config.pad_id
    return batch


def test_fully_masked_attention_rows_match_finite_differences(reference):
    config = VARIANTS["pre-gelu-learned"]
    check_model_against_finite_differences(reference, config, fully_masked_batch(config), 0.1)


def test_tied_table_gets_gradient_from_the_output_projection_too(reference):
    """Untied, rows of tokens absent from the input get no gradient; tied, the output projection gives them some."""
    batch = training_batch(as_kind(TINY, "decoder_only"))
    absent = np.setdiff1d(np.arange(TINY.src_vocab_size), batch["ids"])
    assert absent.size > 0
    for tie, has_gradient in ((False, False), (True, True)):
        config = as_kind(TINY.replace(tie_output=tie), "decoder_only")
        model = reference.impl.build_model(config, init_params(config, seed=11, dtype="float64"))
        grad = reference.impl.loss_and_grads(model, batch)[1]["tgt_embed.token.weight"]
        assert np.any(grad[absent] != 0) == has_gradient


def test_shared_table_gradient_matches_finite_differences(reference):
    """The paper's three-way sharing: one table is the source embedding, the target embedding
    and the output projection; NumPy's backward adds up the gradients of its three uses. Besides
    the model's sampled coordinates, the rows of tokens only the source reads, whose lookup's
    gradient only the encoder's use brings."""
    batch = training_batch(SHARED)
    check_model_against_finite_differences(reference, SHARED, batch, 0.1)
    model = reference.impl.build_model(SHARED, init_params(SHARED, seed=11, dtype="float64", nonzero_biases=True))
    _, grads = reference.impl.loss_and_grads(model, batch, 0.1)
    inputs, targets = split_batch(SHARED, batch)
    loss = lambda: float(reference.impl.cross_entropy(model(*inputs).logits, targets, SHARED.pad_id, 0.1))  # noqa: E731
    table, grad = model.tgt_embed.token.weight, grads["tgt_embed.token.weight"]  # (V, d_model) each
    rows = np.setdiff1d(batch["src_ids"], np.append(batch["tgt_in"], SHARED.pad_id))
    assert rows.size >= 2
    picks = [(int(row), column) for row in rows[:3] for column in (0, 7, SHARED.d_model - 1)]
    numeric = [central_difference(loss, table, index) for index in picks]
    got = grad[tuple(np.array(picks).T)]
    assert_matches_finite_differences(got, numeric, float(np.abs(grad).max()), "rows only the source reads")


def test_shared_table_gradient_is_the_sum_of_its_three_uses(backend, reference):
    """The same model with three copies of the table (its own source table, an untied output
    projection holding the table transposed, a zero bias): the shared table's gradient equals the
    copies' gradients added up, in every backend, in float64, and torch's and JAX's equal NumPy's."""
    params = init_params(SHARED, seed=11, dtype="float64", nonzero_biases=True)
    table = params["tgt_embed.token.weight"]  # (V, d_model)
    copies = SHARED.replace(share_embeddings=False, tie_output=False)
    copied = params | {"src_embed.token.weight": table.copy(), "generator.proj.weight": table.T.copy(),
                       "generator.proj.bias": np.zeros(SHARED.tgt_vocab_size)}  # fmt: skip
    batch = training_batch(SHARED)
    loss, grads = backend.impl.loss_and_grads(backend.impl.build_model(SHARED, params), batch, 0.1)
    copies_loss, copies_grads = backend.impl.loss_and_grads(backend.impl.build_model(copies, copied), batch, 0.1)
    assert list(grads) == list(param_schema(SHARED))  # one parameter: the optimiser sees one table
    three_uses = (copies_grads["src_embed.token.weight"] + copies_grads["tgt_embed.token.weight"]
                  + copies_grads["generator.proj.weight"].T)  # fmt: skip
    assert loss == pytest.approx(copies_loss, rel=1e-12)
    shared = np.asarray(grads["tgt_embed.token.weight"])
    assert np.abs(shared - three_uses).max() <= 1e-12 * np.abs(three_uses).max()
    for name in ("src_embed.token.weight", "tgt_embed.token.weight", "generator.proj.weight"):
        assert np.abs(copies_grads[name]).max() > 0, f"{name}: each use contributes"
    want = reference.impl.loss_and_grads(reference.impl.build_model(SHARED, params), batch, 0.1)
    assert np.abs(shared - want[1]["tgt_embed.token.weight"]).max() <= 1e-12 * np.abs(shared).max()
    assert_loss_and_gradients_match((loss, grads), want, "shared embeddings")


# ------------------------------------------------------------------ every backend against NumPy
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("config", variant_params())
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_loss_and_gradients_match_reference(backend, reference, kind, config, label_smoothing):
    config = as_kind(config, kind)
    batch = training_batch(config)
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    want = reference.impl.loss_and_grads(reference.impl.build_model(config, params), batch, label_smoothing)
    got = backend.impl.loss_and_grads(backend.impl.build_model(config, params), batch, label_smoothing)
    assert isinstance(got[0], float)
    assert list(got[1]) == list(param_schema(config))
    for name, shape in param_schema(config).items():
        assert got[1][name].shape == shape and got[1][name].dtype == np.float64, name
    assert_loss_and_gradients_match(got, want, f"{kind} {label_smoothing=}")


def test_fully_masked_attention_rows_give_finite_gradients_that_match_reference(backend, reference):
    config = VARIANTS["pre-gelu-learned"]
    batch = fully_masked_batch(config)
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    want = reference.impl.loss_and_grads(reference.impl.build_model(config, params), batch, 0.1)
    got = backend.impl.loss_and_grads(backend.impl.build_model(config, params), batch, 0.1)
    assert_loss_and_gradients_match(got, want, "fully masked rows")


def test_an_all_padding_batch_has_zero_loss_and_zero_gradients(backend):
    config = as_kind(TINY, "decoder_only")
    batch = training_batch(config)
    batch["targets"][:] = config.pad_id
    model = backend.impl.build_model(config, init_params(config, seed=11, dtype="float64", nonzero_biases=True))
    loss, grads = backend.impl.loss_and_grads(model, batch, 0.1)
    assert loss == 0.0  # 0 / max(0 counted targets, 1), not NaN
    assert all(np.all(g == 0.0) for g in grads.values())


def test_float32_models_get_float32_gradients(backend):
    """No silent promotion to float64 on the way back (NumPy 2 promotes float32 / int64 arrays)."""
    config = as_kind(TINY, "decoder_only")
    model = backend.impl.build_model(config, init_params(config, seed=11, dtype="float32", nonzero_biases=True))
    loss, grads = backend.impl.loss_and_grads(model, training_batch(config), 0.1)
    assert isinstance(loss, float) and math.isfinite(loss)
    for name, grad in grads.items():
        assert grad.dtype == np.float32 and np.all(np.isfinite(grad)), name


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy_matches_reference(backend, reference, dtype, label_smoothing):
    logits = np.random.default_rng(4).standard_normal((3, 7, 11)) * 5.0
    targets = token_ids(11, 3, 7, pad=True)
    want = reference.impl.cross_entropy(logits, targets, 0, label_smoothing)
    got = backend.call(backend.impl.cross_entropy, logits.astype(dtype), targets, 0, label_smoothing)
    assert got.shape == () and got.dtype == dtype
    assert_close(got, want, dtype, "cross-entropy")


def test_cross_entropy_is_torchs_label_smoothed_cross_entropy_ignoring_padding(reference):
    """The documented definition is the standard one: torch.nn.functional.cross_entropy with
    ignore_index=pad_id and label_smoothing=eps (smoothing spread over the whole vocabulary)."""
    torch = pytest.importorskip("torch")
    logits = np.random.default_rng(5).standard_normal((3, 7, 11)) * 5.0
    targets = token_ids(11, 3, 7, pad=True)
    for eps in (0.0, 0.1, 0.3):
        ours = reference.impl.cross_entropy(logits, targets, 0, eps)
        theirs = torch.nn.functional.cross_entropy(
            torch.from_numpy(logits.reshape(-1, 11)),
            torch.from_numpy(targets.reshape(-1)),
            ignore_index=0,
            label_smoothing=eps,
        )
        assert_close(ours, theirs.numpy(), "float64", f"cross-entropy vs torch, eps={eps}")


def test_cross_entropy_is_optaxs_with_smoothed_labels(reference):
    """The same definition as optax: softmax_cross_entropy against smooth_labels(onehot, eps)."""
    optax = pytest.importorskip("optax")
    logits = np.random.default_rng(6).standard_normal((3, 7, 11)) * 5.0
    targets = token_ids(11, 3, 7, pad=True)
    real = targets != 0
    eps = 0.1
    per_token = optax.softmax_cross_entropy(logits, optax.smooth_labels(np.eye(11)[targets], eps))  # (3, 7)
    theirs = float((np.asarray(per_token) * real).sum() / real.sum())
    assert_close(reference.impl.cross_entropy(logits, targets, 0, eps), theirs, "float64", "cross-entropy vs optax")


# ------------------------------------------------------------------ batches and errors
def test_batches_shift_the_targets_left_by_one():
    ids = np.array([[5, 6, 7, 8], [5, 6, 0, 0]])
    inputs, targets = shift_targets(ids)
    assert inputs.tolist() == [[5, 6, 7], [5, 6, 0]] and targets.tolist() == [[6, 7, 8], [6, 0, 0]]
    assert decoder_only_batch(ids).keys() == {"ids", "targets"}
    batch = encoder_decoder_batch(np.ones((2, 3), int), ids)
    assert batch.keys() == {"src_ids", "tgt_in", "tgt_out"} and batch["tgt_in"].tolist() == inputs.tolist()


def test_loss_and_grads_needs_a_model_with_a_decoder(backend):
    config = as_kind(TINY, "encoder_only")
    model = backend.impl.build_model(config, init_params(config, dtype="float64"))
    with pytest.raises(ValueError, match="loss_and_grads needs a model with a decoder"):
        backend.impl.loss_and_grads(model, {"ids": token_ids(53, 2, 5, pad=False)})


@pytest.mark.parametrize(
    "bad_batch, message",
    [
        (lambda b: {"ids": b["ids"]}, "keys"),
        (lambda b: {"ids": b["ids"], "targets": b["targets"][:, :-1]}, "targets must have the same shape as ids"),
        (lambda b: {"ids": b["ids"], "targets": b["targets"] + 100}, r"targets must lie in \[0, 53\)"),
    ],
    ids=["missing-key", "shape", "target-out-of-range"],
)
def test_bad_batches_raise_the_same_error_in_every_backend(backend, bad_batch, message):
    config = as_kind(TINY, "decoder_only")
    model = backend.impl.build_model(config, init_params(config, dtype="float64"))
    with pytest.raises(ValueError, match=message):
        backend.impl.loss_and_grads(model, bad_batch(training_batch(config)))


@pytest.mark.parametrize("label_smoothing", [-0.1, 1.5, True])
def test_label_smoothing_outside_0_1_is_an_error(backend, label_smoothing):
    logits, targets = np.zeros((1, 2, 5)), np.ones((1, 2), np.int64)
    with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\]"):
        backend.call(backend.impl.cross_entropy, logits, targets, 0, label_smoothing)


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


def test_a_shared_untied_table_gradient_is_the_sum_of_its_two_uses(backend, reference):
    """One table for the source and the target embeddings and an output projection of its own
    (``share_embeddings`` without ``tie_output``): the table's gradient equals the two copies'
    gradients added up, in every backend, and equals NumPy's. (Every other shared-table test is
    tied too, where the output's use could hide a missing source use.)"""
    config = SHARED.replace(tie_output=False)
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    copies = config.replace(share_embeddings=False)
    copied = params | {"src_embed.token.weight": params["tgt_embed.token.weight"].copy()}
    batch = training_batch(config)
    loss, grads = backend.impl.loss_and_grads(backend.impl.build_model(config, params), batch, 0.1)
    copies_loss, copies_grads = backend.impl.loss_and_grads(backend.impl.build_model(copies, copied), batch, 0.1)
    assert list(grads) == list(param_schema(config))
    two_uses = copies_grads["src_embed.token.weight"] + copies_grads["tgt_embed.token.weight"]
    assert loss == pytest.approx(copies_loss, rel=1e-12)
    shared = np.asarray(grads["tgt_embed.token.weight"])
    assert np.abs(shared - two_uses).max() <= 1e-12 * np.abs(two_uses).max()
    assert np.abs(copies_grads["src_embed.token.weight"]).max() > 0, "the source's use contributes"
    want = reference.impl.loss_and_grads(reference.impl.build_model(config, params), batch, 0.1)
    assert_loss_and_gradients_match((loss, grads), want, "shared, untied embeddings")
