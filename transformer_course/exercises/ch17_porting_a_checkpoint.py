"""Chapter 17, porting a checkpoint: a torch Linear's weight in our layout, and a q or k projection moved from one
rotary layout to the other."""

from __future__ import annotations

import numpy as np

from transformer_convert.hf_common import linear

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ hf_linear_to_ours
def _linear_cases():
    rng = np.random.default_rng(17)
    return [
        ("a feed-forward's up projection, torch weight [out 6, in 4]", {"weight": rng.standard_normal((6, 4))}),
        ("a query projection, square [8, 8]: the wrong layout runs too", {"weight": rng.standard_normal((8, 8))}),
        ("one output feature, [1, 5]", {"weight": rng.standard_normal((1, 5))}),
    ]


def _linear_expected(b, x):
    """The project's Hugging Face converters' rule for every nn.Linear (transformer_convert.hf_common.linear),
    in the backend's arrays: the weight our Linear multiplies by, x @ W."""
    return b.to_numpy(b.asarray(linear(x["weight"])))


# ------------------------------------------------------------------ permute_qk_for_rope
THETA = 10000.0


def _roles(b, d_k: int, layout: str) -> list[tuple[int, int]]:
    """(pair, role) of each of a head's d_k features under the backend's own rotation in ``layout``
    (rotate_pairs): the identity rotated by one angle per pair, all different (position 1's: theta^(-2i/d_k)).
    A pair (x1, x2) turns into (x1 cos - x2 sin, x2 cos + x1 sin): feature j keeps the cosine of its pair's
    angle, and hands its partner +sin if it is the pair's first (x1), -sin if it is the second (x2)."""
    cos, sin = (b.to_numpy(t)[1:2] for t in b.impl.rotary_tables(2, d_k, THETA, "float64"))  # (1, d_k / 2)
    rotated = b.call(b.impl.rotate_pairs, np.eye(d_k)[:, None, :], cos, sin, layout)[:, 0, :]  # row j: e_j turned
    roles = []
    for j in range(d_k):
        pair = int(np.argmin(np.abs(cos[0] - rotated[j, j])))  # the angles differ: the cosine names the pair
        handed = rotated[j].sum() - rotated[j, j]  # +sin or -sin, at the partner's place
        roles.append((pair, 0 if handed > 0 else 1))
    return roles


def _rope_expected(b, x):
    """Rows for the halves layout: halves feature k takes the interleaved feature that plays the same part (the
    same pair, the same role) in the backend's rotary embedding, head by head."""
    weight, heads = x["weight"], x["num_heads"]
    d_k = weight.shape[0] // heads
    interleaved = _roles(b, d_k, "interleaved")
    order = [interleaved.index(role) for role in _roles(b, d_k, "halves")]  # halves k <- interleaved order[k]
    return weight.reshape(heads, d_k, -1)[:, order, :].reshape(weight.shape)


def _rope_cases():
    rng = np.random.default_rng(17)
    return [
        ("the query of 2 heads of d_k = 8 from d_model = 16: [16, 16]",
         {"weight": rng.standard_normal((16, 16)), "num_heads": 2}),
        ("the key of 1 key/value head (grouped-query attention), d_k = 8: [8, 16]",
         {"weight": rng.standard_normal((8, 16)), "num_heads": 1}),
        ("3 heads of d_k = 6 (3 pairs each): [18, 10]", {"weight": rng.standard_normal((18, 10)), "num_heads": 3}),
        ("d_k = 2: one pair per head, nothing moves", {"weight": rng.standard_normal((4, 3)), "num_heads": 2}),
    ]  # fmt: skip


def _rows_in_order(weight, num_heads, order_of):
    """weight's rows, head by head, in the order order_of(d_k)."""
    d_k = weight.shape[0] // num_heads
    return weight.reshape(num_heads, d_k, -1)[:, order_of(d_k), :].reshape(weight.shape)


def _to_halves(d_k):  # halves feature k <- interleaved feature: evens first (the pairs' firsts), then odds
    return np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])


def _to_interleaved(d_k):  # the inverse: interleaved feature j <- halves feature [0, h, 1, h + 1, ...]
    return np.stack([np.arange(d_k // 2), np.arange(d_k // 2) + d_k // 2], axis=1).reshape(-1)


EXERCISES = [
    Exercise(
        name="hf_linear_to_ours",
        chapter="17_porting_a_checkpoint",
        task="hf_linear_to_ours(weight) -> [in, out]: weight a torch / Hugging Face nn.Linear weight [out, in] "
        "(y = x @ weight.T + bias); ours computes y = x @ W + bias.",
        cases=_linear_cases,
        expected=_linear_expected,
        mistakes=(
            Mistake(
                "no transpose",
                "torch's nn.Linear stores its weight [out, in] and computes x @ weight.T; ours is [in, out] and "
                "computes x @ W: W = weight.T. A square weight (every q, k, v, o of a model without grouped "
                "kv heads) loads without complaint the wrong way round, and the model computes nonsense.",
                lambda weight: weight,
            ),
            Mistake(
                "reshaped instead of transposed",
                "weight.reshape(in, out) has the right shape but not the right numbers: it reads the [out, in] "
                "rows in memory order and cuts them into rows of another length. A transpose swaps the axes: "
                "weight.T (np.ascontiguousarray(weight.T) for a copy laid out row by row).",
                lambda weight: weight.reshape(weight.shape[1], weight.shape[0]),
            ),
        ),
    ),
    Exercise(
        name="permute_qk_for_rope",
        chapter="17_porting_a_checkpoint",
        task="permute_qk_for_rope(weight, num_heads) -> weight's shape: weight the [num_heads * d_k, in] rows of "
        "a q or k projection for the interleaved rotary layout (GGUF, "
        "Meta's Llama: features 2i and 2i + 1 rotate together); the same projection for the halves layout "
        "(Hugging Face's rotate_half: features i and i + d_k/2), head by head. For k, num_heads is the number "
        "of key/value heads.",
        cases=_rope_cases,
        expected=_rope_expected,
        mistakes=(
            Mistake(
                "no permutation",
                "the two layouts pair different features, so the same rows rotate other pairs together: no error, "
                "only a model whose attention is wrong (fluent-looking nonsense after a few tokens). Within each "
                "head, the halves layout wants the pairs' first features (the even rows) first, then the second "
                "ones (the odd rows).",
                lambda weight, num_heads: weight,
            ),
            Mistake(
                "the inverse permutation",
                "rows [0, h, 1, h + 1, ...] of each head go from halves to interleaved (what llama.cpp's converter "
                "does to a Hugging Face checkpoint); this is the other way: halves feature k takes interleaved "
                "feature [0, 2, 4, ..., 1, 3, 5, ...][k]. The two agree only for d_k <= 4.",
                lambda weight, num_heads: _rows_in_order(weight, num_heads, _to_interleaved),
            ),
            Mistake(
                "one permutation across all heads",
                "each head rotates its own d_k features: permute within each head (reshape to (H, d_k, in)), not "
                "the H * d_k rows as one long head, which moves rows from one head into another.",
                lambda weight, num_heads: _rows_in_order(weight, 1, _to_halves),
            ),
            Mistake(
                "columns permuted instead of rows",
                "the heads' features are the OUTPUT features: the rows of a torch-layout [out, in] weight (the "
                "columns of our [in, out] one). Permuting the input axis of a square q weight runs, and is wrong.",
                lambda weight, num_heads: _rows_in_order(weight.T, num_heads, _to_halves).T,
            ),
        ),
    ),
]
