"""Chapter 5, multi-head attention: split into heads, merge them back, share key/value heads (repeat_kv),
and the whole layer from its weights."""

from __future__ import annotations

import math

import numpy as np

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake

PAD = 0


def _config(d_model: int, num_heads: int, num_kv_heads: int | None = None) -> Config:
    return Config.preset("tiny").replace(d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads)


def _layer(b, config: Config, params=None):
    """The backend's own MultiHeadAttention for ``config`` (its split_heads and merge_heads need no weights)."""
    if params is None:
        params = init_params(config, dtype="float64", component="attention")
    return b.build("MultiHeadAttention", config, params, "float64")


def _causal(seq_len: int) -> np.ndarray:
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))[None, None]  # (1, 1, T, T)


# ------------------------------------------------------------------ split_heads and merge_heads
def _split_cases():
    rng = np.random.default_rng(6)
    return [
        ("B = 2, T = 5, 3 heads of d_k = 4", {"x": rng.standard_normal((2, 5, 12)), "num_heads": 3}),
        ("one position (a decoding step), 4 heads of d_k = 2", {"x": rng.standard_normal((1, 1, 8)), "num_heads": 4}),
        ("one head", {"x": rng.standard_normal((2, 3, 6)), "num_heads": 1}),
    ]


def _split_expected(b, x):
    batch, seq_len, d_model = x["x"].shape
    return b.call(_layer(b, _config(d_model, x["num_heads"])).split_heads, x["x"])


def _merge_cases():
    rng = np.random.default_rng(7)
    return [
        ("B = 2, 3 heads, T = 5, d_k = 4", {"x": rng.standard_normal((2, 3, 5, 4))}),
        ("one position (a decoding step), 4 heads of d_k = 2", {"x": rng.standard_normal((1, 4, 1, 2))}),
        ("one head", {"x": rng.standard_normal((2, 1, 3, 6))}),
    ]


def _merge_expected(b, x):
    batch, heads, seq_len, d_k = x["x"].shape
    return b.call(_layer(b, _config(heads * d_k, heads)).merge_heads, x["x"])


# ------------------------------------------------------------------ repeat_kv
def _repeat_cases():
    rng = np.random.default_rng(8)
    return [
        ("2 key/value heads, each shared by 3 query heads", {"x": rng.standard_normal((2, 2, 4, 3)), "groups": 3}),
        ("groups = 1: multi-head attention, nothing to repeat", {"x": rng.standard_normal((1, 3, 2, 2)), "groups": 1}),
        ("one key/value head for 4 query heads (multi-query)", {"x": rng.standard_normal((1, 1, 3, 2)), "groups": 4}),
    ]


# ------------------------------------------------------------------ multi_head_attention
def _attention_cases():
    rng = np.random.default_rng(9)

    def params(config: Config, seed: int) -> dict[str, np.ndarray]:
        return init_params(config, seed=seed, dtype="float64", component="attention", nonzero_biases=True)

    x = rng.standard_normal((2, 5, 12))
    self_attention = {"query": x, "key": x, "value": x, "mask": _causal(5), "params": params(_config(12, 3), 1),
                      "num_heads": 3}  # fmt: skip
    memory = rng.standard_normal((2, 6, 12))
    keys_padded = np.array([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]  # (2, 1, 1, 6)
    cross_attention = {"query": rng.standard_normal((2, 3, 12)), "key": memory, "value": memory,
                       "mask": keys_padded, "params": params(_config(12, 2), 2), "num_heads": 2}  # fmt: skip
    ids = np.array([[4, 9, 7, 5, PAD], [PAD, 3, 8, 6, 2]])
    decoder_mask = (ids != PAD)[:, None, None, :] & _causal(5)  # (2, 1, 5, 5)
    x = rng.standard_normal((2, 5, 16))
    grouped = {"query": x, "key": x, "value": x, "mask": decoder_mask, "params": params(_config(16, 4, 2), 3),
               "num_heads": 4}  # fmt: skip
    return [
        ("self-attention, causal, d_model = 12, 3 heads", self_attention),
        ("cross-attention: 3 queries, 6 keys, 2 heads, sentence 2's last two keys padded", cross_attention),
        ("grouped-query: 4 query heads of d_k = 4 share 2 key/value heads; padding", grouped),
    ]


def _attention_expected(b, x):
    d_model = x["query"].shape[-1]
    d_k = d_model // x["num_heads"]
    config = _config(d_model, x["num_heads"], x["params"]["w_k.weight"].shape[1] // d_k)
    layer = _layer(b, config, x["params"])
    return b.call(layer, x["query"], x["key"], x["value"], x["mask"])[0]


def _mha(query, key, value, mask, params, num_heads, *, weights_out_in=False, scale_d_model=False,
         merge_by_reshape=False, tile_kv=False):  # fmt: skip
    """Multi-head attention with one classic mistake switched on: the wrong answers below."""
    d_model = query.shape[-1]
    d_k = d_model // num_heads

    def linear(x, name):
        w = params[f"{name}.weight"]
        return x @ (w.T if weights_out_in else w) + params[f"{name}.bias"]

    def split(x):
        return x.reshape(x.shape[0], x.shape[1], -1, d_k).transpose(0, 2, 1, 3)  # (B, heads, T, d_k)

    q, k, v = split(linear(query, "w_q")), split(linear(key, "w_k")), split(linear(value, "w_v"))
    groups = num_heads // k.shape[1]
    copy = (lambda t: np.tile(t, (1, groups, 1, 1))) if tile_kv else (lambda t: np.repeat(t, groups, axis=1))
    k, v = copy(k), copy(v)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d_model if scale_d_model else d_k)
    scores = np.where(mask, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = exp.sum(-1, keepdims=True)
    context = exp / np.where(total > 0, total, 1.0) @ v  # (B, H, T_q, d_k)
    batch, _, seq_len, _ = context.shape
    if merge_by_reshape:
        merged = context.reshape(batch, seq_len, num_heads * d_k)
    else:
        merged = context.transpose(0, 2, 1, 3).reshape(batch, seq_len, num_heads * d_k)
    return linear(merged, "w_o")


EXERCISES = [
    Exercise(
        name="split_heads",
        chapter="05_multi_head_attention",
        task="split_heads(x, num_heads) -> (B, H, T, d_k): x (B, T, H * d_k), head h owning the features "
        "h * d_k .. (h + 1) * d_k - 1 of every position.",
        cases=_split_cases,
        expected=_split_expected,
        mistakes=(
            Mistake(
                "reshape without the transpose",
                "x.reshape(B, H, T, d_k) keeps the numbers in memory order, so 'head 0' gets the first H * d_k "
                "numbers cut into T rows: all heads of the first positions, not one head of every position. "
                "Reshape to (B, T, H, d_k) first, then swap the T and H axes: .transpose(0, 2, 1, 3).",
                lambda x, num_heads: x.reshape(x.shape[0], num_heads, x.shape[1], -1),
            ),
            Mistake(
                "heads from interleaved columns",
                "head h owns the d_k *contiguous* features h * d_k .. (h + 1) * d_k - 1 (the columns of its block "
                "of W_q), not every H-th one: reshape to (B, T, H, d_k), not (B, T, d_k, H).",
                lambda x, num_heads: x.reshape(x.shape[0], x.shape[1], -1, num_heads).transpose(0, 3, 1, 2),
            ),
        ),
    ),
    Exercise(
        name="merge_heads",
        chapter="05_multi_head_attention",
        task="merge_heads(x) -> (B, T, H * d_k): x (B, H, T, d_k), the heads side by side along the features "
        "(the inverse of split_heads).",
        cases=_merge_cases,
        expected=_merge_expected,
        mistakes=(
            Mistake(
                "reshape without the transpose",
                "x.reshape(B, T, H * d_k) keeps the memory order (B, H, T, d_k), so a 'position' gets rows of "
                "several positions of one head. Swap the H and T axes first, .transpose(0, 2, 1, 3), then reshape.",
                lambda x: x.reshape(x.shape[0], x.shape[2], -1),
            ),
            Mistake(
                "features of the heads interleaved",
                "the heads go side by side, head 0's d_k features first: move H next to d_k as (B, T, H, d_k) "
                "before the reshape, not (B, T, d_k, H).",
                lambda x: x.transpose(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
            ),
        ),
    ),
    Exercise(
        name="repeat_kv",
        chapter="05_multi_head_attention",
        task="repeat_kv(x, groups) -> (B, H_kv * groups, T, d_k): x (B, H_kv, T, d_k), each key/value head "
        "repeated for the `groups` query heads that share it (query head h reads key/value head h // groups).",
        cases=_repeat_cases,
        expected=lambda b, x: b.call(b.impl.repeat_kv, x["x"], x["groups"]),
        mistakes=(
            Mistake(
                "tiled instead of repeated kv heads",
                "np.tile gives the heads in the order 0, 1, 0, 1, ... (query head h reads kv head h % H_kv); the "
                "model was trained with 0, 0, 0, 1, 1, 1 (h // groups), as Hugging Face's repeat_kv. Use "
                "np.repeat(x, groups, axis=1): each head next to its copies.",
                lambda x, groups: np.tile(x, (1, groups, 1, 1)),
            ),
            Mistake(
                "repeated along the time axis",
                "the heads are axis 1 of (B, H_kv, T, d_k): np.repeat(x, groups, axis=1), not axis=2 (positions).",
                lambda x, groups: np.repeat(x, groups, axis=2),
            ),
        ),
    ),
    Exercise(
        name="multi_head_attention",
        chapter="05_multi_head_attention",
        task="multi_head_attention(query, key, value, mask, params, num_heads) -> (B, T_q, d_model): project "
        "(x @ W + b, every weight stored [in, out]), split into heads, repeat the key/value heads if there are "
        "fewer (H_kv = params['w_k.weight'].shape[1] // d_k), attend (mask True = may attend), merge, project "
        "with w_o. params: 'w_q.weight' (d_model, H d_k), 'w_k.weight' and 'w_v.weight' (d_model, H_kv d_k), "
        "'w_o.weight' (H d_k, d_model), and a '.bias' for each.",
        cases=_attention_cases,
        expected=_attention_expected,
        mistakes=(
            Mistake(
                "weights read as [out, in]",
                "the weights are stored [in, out] (the paper's x W; Flax's kernel too): x @ W + b. torch's "
                "nn.Linear stores the transpose, [out, in], and computes x @ W.T + b; reading one layout as the "
                "other runs silently whenever the matrix is square.",
                lambda **x: _mha(**x, weights_out_in=True),
            ),
            Mistake(
                "sqrt(d_model) for sqrt(d_k)",
                "each head's scores are divided by sqrt(d_k), d_k = d_model / num_heads, the size of one head: "
                "sqrt(d_model) makes them sqrt(num_heads) times too small.",
                lambda **x: _mha(**x, scale_d_model=True),
            ),
            Mistake(
                "heads merged without the transpose",
                "the context is (B, H, T, d_k): swap H and T, .transpose(0, 2, 1, 3), before reshaping to "
                "(B, T, H * d_k), or each position gets pieces of the others.",
                lambda **x: _mha(**x, merge_by_reshape=True),
            ),
            Mistake(
                "tiled instead of repeated kv heads",
                "with fewer key/value heads, query head h reads kv head h // groups: np.repeat(k, groups, axis=1), "
                "not np.tile (which gives h % H_kv).",
                lambda **x: _mha(**x, tile_kv=True),
            ),
        ),
    ),
]
