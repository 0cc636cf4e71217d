"""Solutions to chapter 3's exercises (embeddings): one function per exercise, named as the exercise."""

import math

import numpy as np


def embed_tokens(ids, weight, config):
    rows = weight[ids]  # (B, T) ids -> (B, T, d_model): one row of the table per token
    return rows * math.sqrt(config.d_model) if config.scale_embeddings else rows


def bert_embeddings(ids, token_type_ids, params, eps):
    seq_len = ids.shape[1]
    x = (
        params["token.weight"][ids]  # (B, T, d_model), not scaled
        + params["position.weight"][:seq_len]  # (T, d_model): the rows of positions 0 .. T - 1
        + params["token_type.weight"][token_type_ids]  # (B, T, d_model): sentence A or B
    )
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)  # biased (divided by d), as LayerNorm
    return (x - mean) / np.sqrt(var + eps) * params["norm.weight"] + params["norm.bias"]
