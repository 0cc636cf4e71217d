"""Chapter 3, embeddings: the token lookup (scaled by sqrt(d_model) in the paper), and BERT's sum of three
lookups."""

from __future__ import annotations

import math

import numpy as np

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ embed_tokens
def _token_cases():
    rng = np.random.default_rng(30)
    paper = Config.preset("tiny").replace(src_vocab_size=20, tgt_vocab_size=20)  # d_model 36, 3 heads of 12
    bert = Config.preset("tiny-bert").replace(src_vocab_size=20)  # not scaled
    last = Config.preset("tiny").replace(d_model=8, num_heads=2, src_vocab_size=5, tgt_vocab_size=5)
    return [
        ("the paper (tiny: d_model 36, 3 heads), 2 sentences of 6", {
            "ids": rng.integers(0, 20, (2, 6)), "weight": rng.standard_normal((20, 36)) / 6.0, "config": paper}),
        ("BERT (tiny-bert): scale_embeddings is False", {
            "ids": rng.integers(0, 20, (2, 6)), "weight": 0.02 * rng.standard_normal((20, 36)), "config": bert}),
        ("the first and the last id of a vocabulary of 5, one repeated, d_model 8", {
            "ids": np.array([[0, 4, 4, 1]]), "weight": rng.standard_normal((5, 8)), "config": last}),
    ]  # fmt: skip


def _bare(config: Config) -> Config:
    """The embedding block reduced to its token lookup: no positions, no token types, no norm."""
    return config.replace(positional="none", type_vocab_size=0, embedding_norm=False)


def _token_expected(b, x):
    block = b.build("Embeddings", _bare(x["config"]), {"token.weight": x["weight"]}, "float64")
    return b.call(block, x["ids"])


# ------------------------------------------------------------------ bert_embeddings
def _bert_cases():
    rng = np.random.default_rng(31)
    bert = Config.preset("tiny-bert")  # d_model 36, vocab 53, 64 positions, 2 token types, eps 1e-12
    pair = {
        "ids": rng.integers(1, 53, (2, 7)),
        "token_type_ids": np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]]),  # sentence A, then B
        "params": init_params(bert, seed=32, dtype="float64", component="embeddings", nonzero_biases=True),
        "eps": bert.layer_norm_eps,
    }
    short = bert.replace(max_len=5, layer_norm_eps=1e-5)
    full = {
        "ids": rng.integers(1, 53, (1, 5)),
        "token_type_ids": np.zeros((1, 5), dtype=int),
        "params": init_params(short, seed=33, dtype="float64", component="embeddings", nonzero_biases=True),
        "eps": 1e-5,
    }
    return [
        ("two sentence pairs of 7 tokens, eps = 1e-12", pair),
        ("one sentence filling every one of 5 positions, one token type only, eps = 1e-5", full),
    ]


def _bert_expected(b, x):
    config = Config.preset("tiny-bert").replace(
        max_len=x["params"]["position.weight"].shape[0], layer_norm_eps=x["eps"]
    )
    block = b.build("Embeddings", config, x["params"], "float64")
    return b.call(block, x["ids"], x["token_type_ids"])


def _norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps) * weight + bias


def _bert(ids, token_type_ids, params, eps, scale=1.0, types=True, norm=True):
    """BERT's embeddings, with one classic mistake switched on by a keyword."""
    x = params["token.weight"][ids] * scale + params["position.weight"][: ids.shape[1]]
    if types:
        x = x + params["token_type.weight"][token_type_ids]
    return _norm(x, params["norm.weight"], params["norm.bias"], eps) if norm else x


EXERCISES = [
    Exercise(
        name="embed_tokens",
        chapter="03_embeddings",
        task="embed_tokens(ids, weight, config) -> (B, T, d_model): the rows of weight (vocab, d_model) that ids "
        "(B, T) name, times sqrt(config.d_model) where config.scale_embeddings is True (the paper), as they are "
        "where it is False (BERT, GPT-2, Llama).",
        cases=_token_cases,
        expected=_token_expected,
        mistakes=(
            Mistake(
                "no sqrt(d_model) scale",
                "The paper multiplies the looked-up rows by sqrt(d_model) (section 3.4), where "
                "config.scale_embeddings says so: weight[ids] * math.sqrt(config.d_model).",
                lambda ids, weight, config: weight[ids],
            ),
            Mistake(
                "sqrt(d_k) instead of sqrt(d_model)",
                "The embedding is scaled by the square root of the model's width, d_model; d_k = d_model / H, "
                "one head's width, belongs to the attention scores' 1 / sqrt(d_k).",
                lambda ids, weight, config: weight[ids] * math.sqrt(config.d_k),
            ),
            Mistake(
                "divided by sqrt(d_model)",
                "The rows are multiplied by sqrt(d_model), not divided (attention divides its scores by "
                "sqrt(d_k); the embedding goes the other way): with the paper's initialisation, std d_model^-0.5, "
                "the product has entries of size 1, like the positional encodings it is added to.",
                lambda ids, weight, config: weight[ids] / math.sqrt(config.d_model),
            ),
            Mistake(
                "scaled whatever the config says",
                "Only the paper's models scale; BERT, GPT-2 and Llama use the rows as they are "
                "(scale_embeddings=False). Multiply by sqrt(d_model) only if config.scale_embeddings.",
                lambda ids, weight, config: weight[ids] * math.sqrt(config.d_model),
            ),
        ),
    ),
    Exercise(
        name="bert_embeddings",
        chapter="03_embeddings",
        task="bert_embeddings(ids, token_type_ids, params, eps) -> (B, T, d_model): LayerNorm(token.weight[ids] + "
        "position.weight[:T] + token_type.weight[token_type_ids]) with params' norm.weight and norm.bias: "
        "(x - mean) / sqrt(var + eps) * weight + bias over the last axis. No sqrt(d_model) scale.",
        cases=_bert_cases,
        expected=_bert_expected,
        mistakes=(
            Mistake(
                "the LayerNorm left out",
                "BERT normalises the sum before the first layer (embedding_norm=True): LayerNorm(token + "
                "position + token type), with params['norm.weight'] and params['norm.bias'].",
                lambda ids, token_type_ids, params, eps: _bert(ids, token_type_ids, params, eps, norm=False),
            ),
            Mistake(
                "the token embedding scaled by sqrt(d_model)",
                "BERT does not scale its token embedding (its tables are drawn with std 0.02 and trained as "
                "they are); the sqrt(d_model) is the paper's, for its sinusoidal positions.",
                lambda ids, token_type_ids, params, eps: _bert(
                    ids, token_type_ids, params, eps, scale=math.sqrt(params["token.weight"].shape[1])
                ),
            ),
            Mistake(
                "the token types left out",
                "Every position also gets the row of its segment: token_type.weight[token_type_ids] (sentence "
                "A = 0, B = 1). Even where every id is 0 that row is added: it is a learned vector, not zeros.",
                lambda ids, token_type_ids, params, eps: _bert(ids, token_type_ids, params, eps, types=False),
            ),
        ),
    ),
]
