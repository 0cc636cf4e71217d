"""The course's checker refuses realistic wrong answers that no exercise lists as a classic mistake.

Each function below is a learner's answer to one exercise with one small bug of its own (an
off-by-one, a wrong axis, a missed transpose, eps in the wrong place, a sign, a forgotten scale...),
none of them equal to a ``Mistake`` the exercise lists. ``check_exercise`` must say "not yet" to each,
without naming a classic mistake: the cases, not the list of known mistakes, are what catch it.
The messages are left to test_exercises.py; only the verdict is held here.

``NOW_LISTED`` holds bugs written here in a learner's own words that the exercises list as classic
mistakes (a pad id written as 0, a cache step on copies, a NaN rounded like a number): they are refused
by that mistake's name, whatever code wrote them.
"""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest
from scipy.special import erf

from transformer_course import check_exercise
from transformer_course.exercises import EXERCISES

from ..helpers import solutions

WRONG_ANSWERS: list[tuple[str, object]] = []  # (exercise, wrong answer): refused, and by no mistake's name
NOW_LISTED: list[tuple[str, object]] = []  # refused by the name of a mistake the exercise has come to list


def wrong(exercise: str, into: list = WRONG_ANSWERS):
    """Registers the function below as a wrong answer to ``exercise``; the function itself is unchanged."""

    def register(fn):
        into.append((exercise, fn))
        return fn

    return register


def _masked_softmax(scores, mask, axis=-1):
    """A correct masked softmax (an empty row gives zeros), for the answers whose bug is elsewhere."""
    scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=axis, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = exp.sum(axis=axis, keepdims=True)
    return exp / np.where(total > 0, total, 1.0)


def _softmax(x):
    exp = np.exp(x - x.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ 01 masks
@wrong("causal_mask")
def causal_mask_one_key_ahead(seq_len):
    # off by one: k=1 also lets position i attend to position i + 1
    return np.tril(np.ones((seq_len, seq_len), dtype=bool), k=1)[None, None]


@wrong("causal_mask")
def causal_mask_of_floats(seq_len):
    # dtype=bool forgotten: a 0/1 float matrix, not a mask
    return np.tril(np.ones((seq_len, seq_len)))[None, None]


@wrong("padding_mask")
def padding_mask_batch_on_the_heads_axis(ids, pad_id):
    # the new axes in the wrong places: (1, B, 1, T), the batch where the heads go
    return (ids != pad_id)[None, :, None, :]


@wrong("decoder_mask")
def decoder_mask_padded_queries_hidden(ids, pad_id):
    # the padding taken on the query axis, (B, 1, T, 1): padded rows hidden, padded keys still visible
    causal = np.tril(np.ones((ids.shape[1], ids.shape[1]), dtype=bool))
    return (ids != pad_id)[:, None, :, None] & causal


@wrong("decoder_mask")
def decoder_mask_diagonal_hidden(ids, pad_id):
    # ~np.triu(k=0) for the causal part: each position also hidden from itself
    causal = ~np.triu(np.ones((ids.shape[1], ids.shape[1]), dtype=bool))
    return (ids != pad_id)[:, None, None, :] & causal


# ------------------------------------------------------------------ 02 positional encodings
@wrong("sinusoidal_table")
def sinusoidal_table_positions_from_one(max_len, d_model):
    # off by one: positions 1 .. max_len instead of 0 .. max_len - 1
    positions = np.arange(1, max_len + 1, dtype=np.float64)[:, None]
    angles = positions / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


@wrong("sinusoidal_table")
def sinusoidal_table_in_float32(max_len, d_model):
    # the table allocated as float32: every value rounded to about 7 digits
    positions = np.arange(max_len, dtype=np.float64)[:, None]
    angles = positions / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    table = np.zeros((max_len, d_model), dtype=np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


@wrong("shift_sinusoids")
def shift_sinusoids_in_place(pe, offset):
    # updated in place: the cosines' line reads the sines the line before has already turned
    d = pe.shape[-1]
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    c, s = np.cos(offset * omega), np.sin(offset * omega)
    pe[..., 0::2] = pe[..., 0::2] * c + pe[..., 1::2] * s
    pe[..., 1::2] = pe[..., 1::2] * c - pe[..., 0::2] * s
    return pe


@wrong("shift_sinusoids")
def shift_sinusoids_adds_the_offsets_row(pe, offset):
    # PE(pos + k) taken for PE(pos) + PE(k): the offset's own row added instead of a rotation
    d = pe.shape[-1]
    angles = offset * 10000.0 ** (-np.arange(0, d, 2) / d)
    row = np.empty(d)
    row[0::2], row[1::2] = np.sin(angles), np.cos(angles)
    return pe + row


# ------------------------------------------------------------------ 03 embeddings
@wrong("embed_tokens")
def embed_tokens_scaled_by_sqrt_vocab(ids, weight, config):
    # sqrt(weight.shape[0]): the table is (vocab, d_model), so that is the vocabulary's size
    rows = weight[ids]
    return rows * math.sqrt(weight.shape[0]) if config.scale_embeddings else rows


@wrong("bert_embeddings")
def bert_embeddings_positions_from_one(ids, token_type_ids, params, eps):
    # RoBERTa's offset copied: position rows 1 .. T instead of 0 .. T - 1
    x = (
        params["token.weight"][ids]
        + params["position.weight"][1 : ids.shape[1] + 1]
        + params["token_type.weight"][token_type_ids]
    )
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * params["norm.weight"] + params["norm.bias"]


@wrong("bert_embeddings")
def bert_embeddings_unbiased_variance(ids, token_type_ids, params, eps):
    # the LayerNorm's variance with ddof=1 (torch.var's default): divided by d - 1
    x = (
        params["token.weight"][ids]
        + params["position.weight"][: ids.shape[1]]
        + params["token_type.weight"][token_type_ids]
    )
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, ddof=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * params["norm.weight"] + params["norm.bias"]


# ------------------------------------------------------------------ 04 attention
@wrong("masked_softmax")
def masked_softmax_over_the_queries(scores, mask):
    # the softmax taken over axis -2 (the queries) instead of the keys
    return _masked_softmax(scores, mask, axis=-2)


@wrong("masked_softmax")
def masked_softmax_mask_after_the_softmax(scores, mask):
    # the mask applied after the softmax: the kept weights no longer sum to 1
    return _softmax(scores) * mask


@wrong("attention")
def attention_divided_by_d_k(q, k, v, mask, d_model):
    # divided by d_k itself, not by its square root
    scores = q @ k.swapaxes(-1, -2) / q.shape[-1]
    return _masked_softmax(scores, mask) @ v


@wrong("attention")
def attention_keys_times_queries(q, k, v, mask, d_model):
    # k @ q^T: the scores transposed, (T_k, T_q), so each row belongs to a key
    scores = k @ q.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    return _masked_softmax(scores, mask) @ v


# ------------------------------------------------------------------ 05 multi-head attention
@wrong("split_heads")
def split_heads_heads_first(x, num_heads):
    # the heads moved in front of the batch: (H, B, T, d_k)
    batch, seq_len, d_model = x.shape
    return np.moveaxis(x.reshape(batch, seq_len, num_heads, d_model // num_heads), 2, 0)


@wrong("merge_heads")
def merge_heads_concatenated_over_the_batch(x):
    # iterating over x walks the batch, not the heads: the sentences are put side by side
    return np.concatenate(list(x), axis=-1)


@wrong("repeat_kv")
def repeat_kv_along_the_features(x, groups):
    # np.repeat along the last axis (d_k), not the heads' axis 1
    return np.repeat(x, groups, axis=-1)


@wrong("multi_head_attention")
def multi_head_attention_biases_left_out(query, key, value, mask, params, num_heads):
    # x @ W without + b: every projection's bias dropped
    d_k = query.shape[-1] // num_heads

    def heads(x, name):
        y = x @ params[f"{name}.weight"]
        return y.reshape(y.shape[0], y.shape[1], -1, d_k).transpose(0, 2, 1, 3)

    q, k, v = heads(query, "w_q"), heads(key, "w_k"), heads(value, "w_v")
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    context = _masked_softmax(q @ k.swapaxes(-1, -2) / math.sqrt(d_k), mask) @ v
    merged = context.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1)
    return merged @ params["w_o.weight"]


# ------------------------------------------------------------------ 06 feed-forward
@wrong("feed_forward")
def feed_forward_bias_after_the_relu(x, w_1, b_1, w_2, b_2):
    # b_1 added after the ReLU instead of before it
    return (np.maximum(x @ w_1, 0.0) + b_1) @ w_2 + b_2


@wrong("feed_forward")
def feed_forward_with_gelu(x, w_1, b_1, w_2, b_2):
    # BERT's GELU where the paper has a ReLU
    h = x @ w_1 + b_1
    return 0.5 * h * (1.0 + erf(h / math.sqrt(2.0))) @ w_2 + b_2


@wrong("swiglu")
def swiglu_with_relu(x, w_gate, w_up, w_down):
    # a ReLU on the gate (ReGLU) instead of SiLU
    return (np.maximum(x @ w_gate, 0.0) * (x @ w_up)) @ w_down


@wrong("swiglu")
def swiglu_sigmoid_sign_slip(x, w_gate, w_up, w_down):
    # silu(z) written z / (1 + exp(z)): the minus lost, z * sigmoid(-z)
    gate = x @ w_gate
    return (gate / (1.0 + np.exp(gate)) * (x @ w_up)) @ w_down


@wrong("exact_gelu")
def exact_gelu_without_the_half(x):
    # the 0.5 forgotten: twice GELU
    return x * (1.0 + erf(x / math.sqrt(2.0)))


@wrong("exact_gelu")
def exact_gelu_without_the_x(x):
    # Phi(x) alone: the distribution function, not x times it
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


@wrong("exact_gelu")
def exact_gelu_times_sqrt_2(x):
    # erf(x * sqrt(2)) instead of erf(x / sqrt(2))
    return 0.5 * x * (1.0 + erf(x * math.sqrt(2.0)))


# ------------------------------------------------------------------ 07 layer norm and the residual
@wrong("layer_norm")
def layer_norm_bias_before_the_weight(x, weight, bias, eps):
    # (x_hat + bias) * weight: the bias added before the scale
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) + bias) * weight


@wrong("layer_norm")
def layer_norm_over_the_whole_array(x, weight, bias, eps):
    # no axis: one mean and one variance for the whole batch, not one per row
    return (x - x.mean()) / np.sqrt(x.var() + eps) * weight + bias


@wrong("rms_norm")
def rms_norm_without_the_square_root(x, weight, eps):
    # divided by the mean square, its square root forgotten
    return x / ((x * x).mean(axis=-1, keepdims=True) + eps) * weight


@wrong("rms_norm")
def rms_norm_over_the_whole_array(x, weight, eps):
    # no axis: one root mean square for the whole batch, not one per row
    return x / np.sqrt((x * x).mean() + eps) * weight


@wrong("residual_connection")
def residual_connection_pre_norm_normalised_again(x, sublayer, norm, norm_first):
    # pre-norm with the post-norm's norm kept too: norm(x + sublayer(norm(x)))
    return norm(x + sublayer(norm(x))) if norm_first else norm(x + sublayer(x))


@wrong("residual_connection")
def residual_connection_without_the_residual(x, sublayer, norm, norm_first):
    # the "+ x" forgotten in both orders
    return sublayer(norm(x)) if norm_first else norm(sublayer(x))


# ------------------------------------------------------------------ 08 encoder
@wrong("encoder_layer")
def encoder_layer_always_post_norm(x, mask, parts, norm_first):
    # norm_first never read: the paper's post-norm whatever the layer is
    h = parts["self_attn_norm"](x + parts["self_attn"](x, x, x, mask))
    return parts["ffn_norm"](h + parts["ffn"](h))


@wrong("encoder_layer")
def encoder_layer_one_norm_for_both(x, mask, parts, norm_first):
    # the attention's norm used for the feed-forward sub-layer too: ffn_norm's weights unused
    def connection(x, sublayer, norm):
        return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))

    h = connection(x, lambda y: parts["self_attn"](y, y, y, mask), parts["self_attn_norm"])
    return connection(h, parts["ffn"], parts["self_attn_norm"])


@wrong("encoder_layer")
def encoder_layer_pre_norm_query_only(x, mask, parts, norm_first):
    # pre-norm normalising the queries only: keys and values read the raw x
    if not norm_first:
        h = parts["self_attn_norm"](x + parts["self_attn"](x, x, x, mask))
        return parts["ffn_norm"](h + parts["ffn"](h))
    h = x + parts["self_attn"](parts["self_attn_norm"](x), x, x, mask)
    return h + parts["ffn"](parts["ffn_norm"](h))


@wrong("encoder_stack")
def encoder_stack_layers_reversed(x, mask, layers, final_norm, norm_first):
    # the layers run last to first
    for layer in reversed(layers):
        x = layer(x, mask)
    return final_norm(x) if norm_first else x


@wrong("encoder_stack")
def encoder_stack_last_layer_skipped(x, mask, layers, final_norm, norm_first):
    # off by one: layers[:-1]
    for layer in layers[:-1]:
        x = layer(x, mask)
    return final_norm(x) if norm_first else x


# ------------------------------------------------------------------ 09 decoder
@wrong("target_mask")
def target_mask_first_sentence_kept(tgt_ids, pad_id):
    # keep[0] = True keeps every position of sentence 0, not position 0 of every sentence
    keep = tgt_ids != pad_id
    keep[0] = True
    causal = np.tril(np.ones((tgt_ids.shape[1], tgt_ids.shape[1]), dtype=bool))
    return keep[:, None, None, :] & causal


@wrong("target_mask")
def target_mask_pad_id_written_as_0(tgt_ids, pad_id):
    # tgt_ids != 0: the pad id hard-coded, wrong for Marian's pad id
    keep = (tgt_ids != 0) | (np.arange(tgt_ids.shape[1]) == 0)
    causal = np.tril(np.ones((tgt_ids.shape[1], tgt_ids.shape[1]), dtype=bool))
    return keep[:, None, None, :] & causal


@wrong("cross_attention_mask")
def cross_attention_mask_target_padding_too(src_ids, tgt_ids, pad_id):
    # the target's padding ANDed in on the query axis: (B, 1, T_tgt, T_src)
    return (src_ids != pad_id)[:, None, None, :] & (tgt_ids != pad_id)[:, None, :, None]


@wrong("cross_attention_mask")
def cross_attention_mask_pad_id_written_as_0(src_ids, tgt_ids, pad_id):
    # src_ids != 0: the pad id hard-coded
    return (src_ids != 0)[:, None, None, :]


@wrong("decoder_layer")
def decoder_layer_memory_mask_left_out(x, memory, tgt_mask, memory_mask, parts, norm_first):
    # the cross-attention called without memory_mask: the source's padding attended
    def connection(x, sublayer, norm):
        return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))

    x = connection(x, lambda h: parts["self_attn"](h, h, h, tgt_mask), parts["self_attn_norm"])
    x = connection(x, lambda h: parts["cross_attn"](h, memory, memory, None), parts["cross_attn_norm"])
    return connection(x, parts["ffn"], parts["ffn_norm"])


@wrong("decoder_layer")
def decoder_layer_cross_attention_over_itself(x, memory, tgt_mask, memory_mask, parts, norm_first):
    # the self-attention line copied: the cross-attention's keys and values from x, not the memory
    def connection(x, sublayer, norm):
        return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))

    x = connection(x, lambda h: parts["self_attn"](h, h, h, tgt_mask), parts["self_attn_norm"])
    x = connection(x, lambda h: parts["cross_attn"](h, h, h, tgt_mask), parts["cross_attn_norm"])
    return connection(x, parts["ffn"], parts["ffn_norm"])


# ------------------------------------------------------------------ 10 models
def _count(config, norm_bias=True, cross_norm=True):
    """count_parameters as the solution writes it, with two places for a bug."""
    d = config.d_model

    def linear(d_in, d_out):
        return d_in * d_out + (d_out if config.bias else 0)

    norm = 2 * d if config.bias and norm_bias else d
    attention, ffn = 4 * linear(d, d), linear(d, config.d_ff) + linear(config.d_ff, d)
    positions = config.max_len * d if config.positional == "learned" else 0
    total = 0
    if config.kind in ("encoder_decoder", "encoder_only"):
        total += config.src_vocab_size * d + positions
        total += config.num_encoder_layers * (attention + ffn + 2 * norm) + (norm if config.encoder_final_norm else 0)
    if config.kind in ("encoder_decoder", "decoder_only"):
        cross = (attention + (norm if cross_norm else 0)) if config.kind == "encoder_decoder" else 0
        total += config.tgt_vocab_size * d + positions
        total += config.num_decoder_layers * (attention + cross + ffn + 2 * norm)
        total += norm if config.decoder_final_norm else 0
        total += 0 if config.tie_output else linear(d, config.tgt_vocab_size)
    return total


@wrong("count_parameters")
def count_parameters_norms_without_bias(config):
    # every LayerNorm counted as d_model weights, its bias forgotten
    return _count(config, norm_bias=False)


@wrong("count_parameters")
def count_parameters_cross_attention_norm_forgotten(config):
    # the cross-attention counted, the norm around it not
    return _count(config, cross_norm=False)


@wrong("tied_logits")
def tied_logits_softmax_applied(hidden, embedding):
    # probabilities returned, not logits
    return _softmax(hidden @ embedding.T)


@wrong("tied_logits")
def tied_logits_divided_by_sqrt_d_model(hidden, embedding):
    # the embedding's sqrt(d_model) undone on the way out
    return hidden @ embedding.T / math.sqrt(embedding.shape[1])


# ------------------------------------------------------------------ 11 loss
def _log_softmax(logits, axis=-1):
    shifted = logits - logits.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _nll(log_p, targets):
    return -np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]


@wrong("cross_entropy_loss")
def cross_entropy_loss_log_softmax_over_time(logits, targets, pad_id):
    # the log-softmax taken over axis 1 (the positions), not over the vocabulary
    real = targets != pad_id
    return np.where(real, _nll(_log_softmax(logits, axis=1), targets), 0.0).sum() / max(real.sum(), 1)


@wrong("cross_entropy_loss")
def cross_entropy_loss_padding_summed(logits, targets, pad_id):
    # the padding's losses summed too, divided by the count of real targets only
    real = targets != pad_id
    return _nll(_log_softmax(logits), targets).sum() / max(real.sum(), 1)


@wrong("cross_entropy_loss")
def cross_entropy_loss_mean_of_an_empty_selection(logits, targets, pad_id):
    # nll[real].mean(): NaN, not 0, for a batch of padding only
    return _nll(_log_softmax(logits), targets)[targets != pad_id].mean()


@wrong("label_smoothed_loss")
def label_smoothed_loss_weights_swapped(logits, targets, pad_id, label_smoothing):
    # eps on the target's term and 1 - eps on the uniform one
    log_p = _log_softmax(logits)
    per_token = label_smoothing * _nll(log_p, targets) + (1.0 - label_smoothing) * -log_p.mean(axis=-1)
    real = targets != pad_id
    return np.where(real, per_token, 0.0).sum() / max(real.sum(), 1)


@wrong("label_smoothed_loss")
def label_smoothed_loss_uniform_term_summed(logits, targets, pad_id, label_smoothing):
    # the uniform term summed over the vocabulary instead of averaged: eps on every class, not eps / V
    log_p = _log_softmax(logits)
    per_token = (1.0 - label_smoothing) * _nll(log_p, targets) + label_smoothing * -log_p.sum(axis=-1)
    real = targets != pad_id
    return np.where(real, per_token, 0.0).sum() / max(real.sum(), 1)


# ------------------------------------------------------------------ 12 gradients
@wrong("layer_norm_backward")
def layer_norm_backward_weight_at_the_end(x, weight, eps, grad_output):
    # the weight multiplied into the result, not into the gradient that reaches x_hat
    mean = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    x_hat, g = (x - mean) / std, grad_output
    return (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std * weight


@wrong("layer_norm_backward")
def layer_norm_backward_std_without_eps(x, weight, eps, grad_output):
    # x.std() for the divisor: eps left out of the backward
    std = x.std(axis=-1, keepdims=True)
    x_hat, g = (x - x.mean(axis=-1, keepdims=True)) / std, grad_output * weight
    return (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std


@wrong("softmax_backward")
def softmax_backward_sign_flipped(scores, mask, grad_weights):
    # + sum(g * s) where the Jacobian's off-diagonal part subtracts it
    s = _masked_softmax(scores, mask)
    return s * (grad_weights + (grad_weights * s).sum(axis=-1, keepdims=True))


@wrong("softmax_backward")
def softmax_backward_summed_over_everything(scores, mask, grad_weights):
    # .sum() without an axis: one number for the whole batch instead of one per row
    s = _masked_softmax(scores, mask)
    return s * (grad_weights - (grad_weights * s).sum())


@wrong("linear_weight_grad")
def linear_weight_grad_einsum_indices_apart(x, grad_output):
    # einsum("bti,bsj->ij"): t and s apart, every position paired with every other
    return np.einsum("bti,bsj->ij", x, grad_output)


@wrong("linear_weight_grad")
def linear_weight_grad_first_sequence_only(x, grad_output):
    # x[0]: only the first sequence of the batch
    return x[0].T @ grad_output[0]


# ------------------------------------------------------------------ 13 training
@wrong("warmup_schedule")
def warmup_schedule_times_sqrt_d_model(steps, d_model, warmup_steps):
    # d_model ** 0.5 instead of d_model ** -0.5
    steps = np.maximum(np.asarray(steps, dtype=np.float64), 1.0)
    return d_model**0.5 * np.minimum(steps**-0.5, steps * warmup_steps**-1.5)


@wrong("warmup_schedule")
def warmup_schedule_warmup_to_the_minus_half(steps, d_model, warmup_steps):
    # warmup_steps ** -0.5 in the warm-up branch instead of ** -1.5
    steps = np.maximum(np.asarray(steps, dtype=np.float64), 1.0)
    return d_model**-0.5 * np.minimum(steps**-0.5, steps * warmup_steps**-0.5)


@wrong("adam_step")
def adam_step_returns_corrected_moments(param, grad, m, v, t, lr, beta1, beta2, eps):
    # m_hat and v_hat returned as the new moments: the next step corrects them again
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m_hat, v_hat


@wrong("adam_step")
def adam_step_without_the_square_root(param, grad, m, v, t, lr, beta1, beta2, eps):
    # divided by v_hat, not by sqrt(v_hat)
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    return param - lr * m_hat / (v_hat + eps), m, v


@wrong("adam_step")
def adam_step_paper_betas_written_in(param, grad, m, v, t, lr, beta1, beta2, eps):
    # 0.9 and 0.98 written in: the beta1 and beta2 passed in are never read
    m = 0.9 * m + 0.1 * grad
    v = 0.98 * v + 0.02 * grad * grad
    m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.98**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


# ------------------------------------------------------------------ 14 decoding
@wrong("kv_cache_step")
def kv_cache_step_not_scaled(q, k_new, v_new, k_cache, v_cache, position):
    # the 1 / sqrt(d_k) left out of the scores
    k_cache[:, :, position : position + 1], v_cache[:, :, position : position + 1] = k_new, v_new
    keys, values = k_cache[:, :, : position + 1], v_cache[:, :, : position + 1]
    return _softmax(q @ keys.swapaxes(-1, -2)) @ values


@wrong("kv_cache_step")
def kv_cache_step_position_read_as_the_last_slot(q, k_new, v_new, k_cache, v_cache, position):
    # off by one: the new entry written into slot position + 1, and the empty slot position attended
    k_cache[:, :, position + 1 : position + 2], v_cache[:, :, position + 1 : position + 2] = k_new, v_new
    keys, values = k_cache[:, :, : position + 2], v_cache[:, :, : position + 2]
    return _softmax(q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1])) @ values


@wrong("top_k_filter")
def top_k_filter_strictly_greater(logits, k):
    # logits > kth: the k-th largest itself dropped, k - 1 tokens kept
    kth = np.sort(logits, axis=-1)[:, -k][:, None]
    return _softmax(np.where(logits > kth, logits, -np.inf))


@wrong("top_k_filter")
def top_k_filter_dropped_logits_set_to_0(logits, k):
    # the dropped logits set to 0, not -inf: they keep exp(0) of the mass
    kth = np.sort(logits, axis=-1)[:, -k][:, None]
    return _softmax(np.where(logits >= kth, logits, 0.0))


@wrong("top_p_filter")
def top_p_filter_least_probable_first(logits, top_p):
    # np.argsort(probs) without the minus: the nucleus gathered from the least probable tokens
    probs = _softmax(logits)
    order = np.argsort(probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    keep = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(keep, order, np.cumsum(ranked, axis=-1) - ranked < top_p, axis=-1)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


@wrong("top_p_filter")
def top_p_filter_not_sorted(logits, top_p):
    # the cumulative probability taken in id order: the sort forgotten
    probs = _softmax(logits)
    kept = np.where(np.cumsum(probs, axis=-1) - probs < top_p, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ 15 modern decoder
def _cos_sin(seq_len, d_k, offset, theta):
    angle = np.outer(offset + np.arange(seq_len), 1.0 / theta ** (np.arange(0, d_k, 2) / d_k))
    return np.cos(angle), np.sin(angle)


@wrong("rope_rotate_half")
def rope_rotate_half_angles_repeated(x, offset, theta):
    # np.repeat(cos, 2) (the interleaved layout's table) with rotate_half's pairs
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
    x1, x2 = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


@wrong("rope_rotate_half")
def rope_rotate_half_positions_from_one(x, offset, theta):
    # off by one: positions offset + 1 .. offset + T
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset + 1, theta)
    cos, sin = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
    x1, x2 = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


@wrong("rope_interleaved")
def rope_interleaved_partner_signs_swapped(x, offset, theta):
    # the partner (x_2i+1, -x_2i) instead of (-x_2i+1, x_2i): each pair turned the other way
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
    partner = np.stack([x[..., 1::2], -x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * cos + partner * sin


@wrong("rope_interleaved")
def rope_interleaved_partner_not_interleaved(x, offset, theta):
    # the partner concatenated, [-odds | evens], where it must be interleaved
    cos, sin = _cos_sin(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
    partner = np.concatenate([-x[..., 1::2], x[..., 0::2]], axis=-1)
    return x * cos + partner * sin


def _grouped_scores(q, k, v):
    batch, heads, t_q, d_k = q.shape
    q = q.reshape(batch, k.shape[1], heads // k.shape[1], t_q, d_k)
    return q @ k[:, :, None].swapaxes(-1, -2) / np.sqrt(d_k), v[:, :, None]  # (B, H_kv, groups, T_q, T_k)


@wrong("grouped_query_attention")
def grouped_query_attention_mask_ignored(q, k, v, mask):
    # the mask never applied: every query attends to every key
    scores, v = _grouped_scores(q, k, v)
    return (_softmax(scores) @ v).reshape(q.shape)


@wrong("grouped_query_attention")
def grouped_query_attention_mask_after_the_softmax(q, k, v, mask):
    # the mask multiplied into the weights after the softmax: they no longer sum to 1
    scores, v = _grouped_scores(q, k, v)
    weights = _softmax(scores)
    if mask is not None:
        weights = weights * mask[:, :, None]
    return (weights @ v).reshape(q.shape)


# ------------------------------------------------------------------ 16 data parallel and bf16
@wrong("average_gradients")
def average_gradients_by_the_number_of_replicas(grads, counts):
    # the token-weighted sum divided by the number of replicas, not by the number of tokens
    return np.asarray(counts, dtype=np.float64) @ grads / len(counts)


@wrong("to_bfloat16")
def to_bfloat16_astype_instead_of_view(x):
    # .astype(np.float32) converts the bit pattern's integer value; .view reads the bits as a float
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & np.uint32(0xFFFF0000)).astype(np.float32)


@wrong("to_bfloat16")
def to_bfloat16_returns_the_16_bits(x):
    # the bfloat16's bit pattern returned (uint16), not the float32 it stands for
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


# ------------------------------------------------------------------ 17 porting a checkpoint
@wrong("hf_linear_to_ours")
def hf_linear_to_ours_pseudo_inverse(weight):
    # np.linalg.pinv: the inverse map, which has the [in, out] shape too, but not the weight
    return np.linalg.pinv(weight)


@wrong("hf_linear_to_ours")
def hf_linear_to_ours_rot90(weight):
    # np.rot90 for a transpose: the right shape, the rows in reverse order
    return np.rot90(weight)


@wrong("permute_qk_for_rope")
def permute_qk_for_rope_odd_rows_first(weight, num_heads):
    # the pairs' second features (the odd rows) put first
    d_k = weight.shape[0] // num_heads
    order = np.concatenate([np.arange(1, d_k, 2), np.arange(0, d_k, 2)])
    return weight.reshape(num_heads, d_k, -1)[:, order, :].reshape(weight.shape)


@wrong("permute_qk_for_rope")
def permute_qk_for_rope_heads_axis_second(weight, num_heads):
    # reshaped to (d_k, H, in): the rows cut into heads along the wrong axis
    d_k = weight.shape[0] // num_heads
    order = np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])
    return weight.reshape(d_k, num_heads, -1)[order].reshape(weight.shape)


# ------------------------------------------------------------------ 18 sharding
@wrong("reduce_scatter")
def reduce_scatter_mean(buffers):
    # the mean over the ranks, not the sum
    buffers = np.asarray(buffers)
    return buffers.mean(axis=0).reshape(len(buffers), -1)


@wrong("reduce_scatter")
def reduce_scatter_strided_slices(buffers):
    # rank r keeps elements r, r + N, r + 2N, ..., not its contiguous slice
    buffers = np.asarray(buffers)
    return buffers.sum(axis=0).reshape(-1, len(buffers)).T


@wrong("tensor_parallel_kv")
def tensor_parallel_kv_reshaped(w_k, d_k, tensor_parallel, num_heads):
    # reshape instead of a split: the matrix cut in memory order, rows mixed into columns
    return w_k.reshape(tensor_parallel, w_k.shape[0], -1)


@wrong("tensor_parallel_kv")
def tensor_parallel_kv_query_heads_counted(w_k, d_k, tensor_parallel, num_heads):
    # num_heads // K heads per rank: the query heads' count used for the key/value heads
    width = num_heads // tensor_parallel * d_k
    return np.stack([w_k[:, t * width : (t + 1) * width] for t in range(tensor_parallel)])


# ------------------------------------------------------------------ caught, and now listed
# The bugs the exercises' cases were strengthened for: the new cases catch them, and the exercises
# now list each as a classic mistake, so the checker refuses them by name.
@wrong("padding_mask", NOW_LISTED)
def padding_mask_pad_id_written_as_0(ids, pad_id):
    # ids != 0: the pad id hard-coded
    return (ids != 0)[:, None, None, :]


@wrong("decoder_mask", NOW_LISTED)
def decoder_mask_pad_id_written_as_0(ids, pad_id):
    # ids != 0: the pad id hard-coded
    return (ids != 0)[:, None, None, :] & np.tril(np.ones((ids.shape[1], ids.shape[1]), dtype=bool))


@wrong("cross_entropy_loss", NOW_LISTED)
def cross_entropy_loss_pad_id_written_as_0(logits, targets, pad_id):
    # targets != 0: the pad id hard-coded
    real = targets != 0
    return np.where(real, _nll(_log_softmax(logits), targets), 0.0).sum() / max(real.sum(), 1)


@wrong("label_smoothed_loss", NOW_LISTED)
def label_smoothed_loss_pad_id_written_as_0(logits, targets, pad_id, label_smoothing):
    # targets != 0: the pad id hard-coded
    log_p = _log_softmax(logits)
    per_token = (1.0 - label_smoothing) * _nll(log_p, targets) + label_smoothing * -log_p.mean(axis=-1)
    real = targets != 0
    return np.where(real, per_token, 0.0).sum() / max(real.sum(), 1)


@wrong("kv_cache_step", NOW_LISTED)
def kv_cache_step_buffers_never_written(q, k_new, v_new, k_cache, v_cache, position):
    # np.concatenate builds new arrays: the right context, and the cache's buffers left as they were
    keys = np.concatenate([k_cache[:, :, :position], k_new], axis=2)
    values = np.concatenate([v_cache[:, :, :position], v_new], axis=2)
    return _softmax(q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1])) @ values


@wrong("to_bfloat16", NOW_LISTED)
def to_bfloat16_no_nan_check(x):
    # a NaN's bits rounded like a number's: a payload in the low half carries into the exponent or is cut off
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & np.uint32(0xFFFF0000)).view(np.float32)


# ------------------------------------------------------------------ caught by the cases added last
@wrong("average_gradients")
def average_gradients_no_guard_for_a_batch_of_padding(grads, counts):
    # counts / counts.sum(): 0 / 0, NaN gradients, when no replica holds a real target
    return (np.asarray(counts, dtype=np.float64) / np.sum(counts)) @ grads


@wrong("top_p_filter")
def top_p_filter_at_or_below_p(logits, top_p):
    # above <= top_p: one token too many where the tokens ranked above it reach top_p exactly
    probs = _softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    keep = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(keep, order, np.cumsum(ranked, axis=-1) - ranked <= top_p, axis=-1)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ the tests
ALL = WRONG_ANSWERS + NOW_LISTED


def _ids(pairs):
    return [f"{name}-{fn.__name__}" for name, fn in pairs]


def _params():
    for name, fn in WRONG_ANSWERS:
        yield pytest.param(name, fn, False, id=f"{name}-{fn.__name__}")
    for name, fn in NOW_LISTED:
        yield pytest.param(name, fn, True, id=f"{name}-{fn.__name__}")


@pytest.mark.parametrize("name, wrong_answer, listed", list(_params()))
def test_the_checker_refuses_a_wrong_answer(name, wrong_answer, listed):
    with np.errstate(all="ignore"), warnings.catch_warnings():  # a wrong answer's overflow or 0 / 0 is its own
        warnings.simplefilter("ignore", RuntimeWarning)
        result = check_exercise(EXERCISES[name], wrong_answer)
    assert not result.ok, f"the checker accepts {wrong_answer.__name__}: {result}"
    if listed:
        assert result.mistake is not None, f"{wrong_answer.__name__} is no longer a listed mistake: {result}"
    else:
        assert result.mistake is None, f"{wrong_answer.__name__} is a listed mistake, {result.mistake!r}"


def test_the_wrong_answers_cover_every_chapter_and_most_exercises():
    covered = {name for name, _ in WRONG_ANSWERS}
    assert len(WRONG_ANSWERS) >= 48 and len(covered) >= 30, (len(WRONG_ANSWERS), len(covered))
    assert {EXERCISES[name].chapter for name in covered} == {e.chapter for e in EXERCISES.values()}
    assert len(set(_ids(ALL))) == len(ALL)


@pytest.mark.parametrize("name, wrong_answer", ALL, ids=_ids(ALL))
def test_a_wrong_answer_takes_the_exercises_arguments(name, wrong_answer):
    """Each wrong answer has the signature of the shipped solution: it fails by its bug, not by its arguments."""
    solution = getattr(solutions(EXERCISES[name].chapter), name)
    assert list(inspect.signature(wrong_answer).parameters) == list(inspect.signature(solution).parameters)
