"""Chapter 15, the modern decoder: rotary position embedding in its two layouts, and grouped-query
attention computed without copying the key/value heads."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ rope_rotate_half and rope_interleaved
def _rope_config(d_k: int, theta: float, layout: str) -> Config:
    return Config.preset("tiny-llama").replace(
        d_model=d_k, num_heads=1, num_kv_heads=1, rope_theta=theta, rope_layout=layout, max_len=32
    )


def _rope_cases():
    rng = np.random.default_rng(17)
    return [
        ("(1, 2, 5, 8): positions 0 .. 4, theta = 100000 (SmolLM2)",
         {"x": rng.standard_normal((1, 2, 5, 8)), "offset": 0, "theta": 100000.0}),
        ("one decoding step at position 9 (offset 9), (2, 3, 1, 6), theta = 10000",
         {"x": rng.standard_normal((2, 3, 1, 6)), "offset": 9, "theta": 10000.0}),
        ("d_k = 2, a single pair (both layouts agree): positions 3 .. 6, theta = 500000",
         {"x": rng.standard_normal((1, 1, 4, 2)), "offset": 3, "theta": 500000.0}),
    ]  # fmt: skip


def _rope_expected(layout: str):
    def expected(b, x):
        rotary = b.impl.RotaryEmbedding(_rope_config(x["x"].shape[-1], x["theta"], layout), "float64")
        return b.call(rotary, x["x"], offset=x["offset"])  # (B, H, T, d_k)

    return expected


def _angles(seq_len, d_k, offset, theta, exponent=2):
    positions = offset + np.arange(seq_len)[:, None]  # (T, 1)
    return positions * theta ** (-exponent * np.arange(d_k // 2) / d_k)  # (T, d_k / 2)


def _rotate(x, offset, theta, layout, sign=1.0, exponent=2):
    """The rotation written plainly, for the wrong answers: pairs (i, i + d_k/2) or (2i, 2i + 1)."""
    angle = sign * _angles(x.shape[-2], x.shape[-1], offset, theta, exponent)
    cos, sin = np.cos(angle), np.sin(angle)
    if layout == "halves":
        first, second = np.split(x, 2, axis=-1)
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    first, second = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = first * cos - second * sin, second * cos + first * sin
    return out


def _angles_tiled(x, offset, theta):
    """The interleaved rotation with the halves layout's angle table [angles | angles]."""
    angle = _angles(x.shape[-2], x.shape[-1], offset, theta)
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))
    partner = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * cos + partner * sin


def _rope_mistakes(layout: str) -> tuple[Mistake, ...]:
    other = "interleaved" if layout == "halves" else "halves"
    pairs = {"halves": "(i, i + d_k/2), HF Llama's rotate_half", "interleaved": "(2i, 2i + 1), GGUF's and GPT-J's"}
    common = (
        Mistake(
            {"halves": "the rotate-half layout", "interleaved": "the interleaved layout"}[other],
            f"this exercise pairs features {pairs[layout]}; you paired {pairs[other]}. Both are rotations "
            "and both run; a model's q/k weights were trained for one of them, and the other gives no error, "
            "only another model (transformer_convert.rope permutes weights from one layout to the other).",
            lambda x, offset, theta: _rotate(x, offset, theta, other),
        ),
        Mistake(
            "the frequency base fixed at 10000",
            "pair i turns by theta^(-2i/d_k) per position with the model's own theta (rope_theta: 100000 for "
            "SmolLM2, 500000 for Llama 3); 10000 is only RoFormer's and Llama 1/2's value.",
            lambda x, offset, theta: _rotate(x, offset, 10000.0, layout),
        ),
        Mistake(
            "positions not offset",
            "x's tokens sit at positions offset .. offset + T - 1: a decoding step at position 9 is rotated by "
            "9 times each angle, not 0. Counting from 0 again at every step makes every new token look like "
            "the first one.",
            lambda x, offset, theta: _rotate(x, 0, theta, layout),
        ),
        Mistake(
            "the exponent -i/d_k",
            "the frequencies are theta^(-2i/d_k) for pair i = 0 .. d_k/2 - 1 (np.arange(0, d_k, 2) / d_k): "
            "with -i/d_k the slowest pair turns theta^(1/2) times too fast.",
            lambda x, offset, theta: _rotate(x, offset, theta, layout, exponent=1),
        ),
    )
    if layout == "halves":
        return (
            *common,
            Mistake(
                "rotate_half's sign flipped",
                "rotate_half(x) is [-x2, x1] (x cos + rotate_half(x) sin rotates by +angle); [x2, -x1] rotates "
                "by -angle: the scores then depend on n - m instead of m - n, another model.",
                lambda x, offset, theta: _rotate(x, offset, theta, layout, sign=-1.0),
            ),
        )
    return (
        *common,
        Mistake(
            "the angles tiled, not repeated per pair",
            "in the interleaved layout features 2i and 2i + 1 share pair i's angle: repeat each angle twice "
            "(np.repeat(angle, 2, axis=-1)); [angles | angles] is the table of the rotate-half layout.",
            lambda x, offset, theta: _angles_tiled(x, offset, theta),
        ),
    )


# ------------------------------------------------------------------ grouped_query_attention
def _causal(seq_len: int) -> np.ndarray:
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))[None, None]  # (1, 1, T, T)


def _gqa_cases():
    rng = np.random.default_rng(18)
    padding = np.array([True, True, True, True, False])[None, None, None, :]  # (1, 1, 1, 5): the last key is padding
    return [
        ("B = 2, 6 query heads sharing 2 key/value heads (groups of 3), d_k = 4, T = 5, causal mask",
         {"q": rng.standard_normal((2, 6, 5, 4)), "k": rng.standard_normal((2, 2, 5, 4)),
          "v": rng.standard_normal((2, 2, 5, 4)), "mask": _causal(5)}),
        ("multi-query (one key/value head for 4 query heads), one decoding step over 6 keys, no mask",
         {"q": rng.standard_normal((1, 4, 1, 2)), "k": rng.standard_normal((1, 1, 6, 2)),
          "v": rng.standard_normal((1, 1, 6, 2)), "mask": None}),
        ("plain multi-head (3 and 3 heads: groups of 1), a padded key",
         {"q": rng.standard_normal((1, 3, 4, 2)), "k": rng.standard_normal((1, 3, 5, 2)),
          "v": rng.standard_normal((1, 3, 5, 2)), "mask": padding}),
    ]  # fmt: skip


def _gqa_expected(b, x):
    groups = x["q"].shape[1] // x["k"].shape[1]

    def attend(q, k, v, mask):
        k, v = b.impl.repeat_kv(k, groups), b.impl.repeat_kv(v, groups)  # (B, H, T_k, d_k) each
        return b.impl.scaled_dot_product_attention(q, k, v, mask)[0]  # (B, H, T_q, d_k)

    return b.call(attend, x["q"], x["k"], x["v"], x["mask"])


def _plain_attention(q, k, v, mask, scale):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(scale)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


def _tiled(q, k, v, mask):
    groups = q.shape[1] // k.shape[1]
    tile = (1, groups, 1, 1)
    return _plain_attention(q, np.tile(k, tile), np.tile(v, tile), mask, q.shape[-1])


def _scaled_by_width(q, k, v, mask):
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    return _plain_attention(q, k, v, mask, q.shape[1] * q.shape[-1])  # sqrt(H d_k) = sqrt(d_model)


EXERCISES = [
    Exercise(
        name="rope_rotate_half",
        chapter="15_modern_decoder",
        task="rope_rotate_half(x, offset, theta) -> (B, H, T, d_k): x's tokens at positions offset .. offset + T - 1 "
        "rotated, pair i = features (i, i + d_k/2), by position * theta^(-2i/d_k).",
        cases=_rope_cases,
        expected=_rope_expected("halves"),
        mistakes=_rope_mistakes("halves"),
    ),
    Exercise(
        name="rope_interleaved",
        chapter="15_modern_decoder",
        task="rope_interleaved(x, offset, theta) -> (B, H, T, d_k): as rope_rotate_half, with pair i = features "
        "(2i, 2i + 1).",
        cases=_rope_cases,
        expected=_rope_expected("interleaved"),
        mistakes=_rope_mistakes("interleaved"),
    ),
    Exercise(
        name="grouped_query_attention",
        chapter="15_modern_decoder",
        task="grouped_query_attention(q, k, v, mask) -> context (B, H, T_q, d_k), for q (B, H, T_q, d_k), k and v "
        "(B, H_kv, T_k, d_k), mask (B|1, 1, T_q, T_k) bool or None: query head h attends with key/value head "
        "h // (H / H_kv).",
        cases=_gqa_cases,
        expected=_gqa_expected,
        mistakes=(
            Mistake(
                "tiled instead of repeated kv heads",
                "query head h reads key/value head h // groups (the copies of one head side by side: np.repeat, "
                "or q reshaped to (B, H_kv, groups, T, d_k)); np.tile, or a reshape to (B, groups, H_kv, ...), "
                "gives head h the kv head h % H_kv: the right shape and another model.",
                _tiled,
            ),
            Mistake(
                "sqrt(d_model) for sqrt(d_k)",
                "the scores are divided by the square root of one head's size d_k (q.shape[-1]), not of all the "
                "query heads' width H d_k = d_model.",
                _scaled_by_width,
            ),
        ),
    ),
]
