"""Chapter 14, decoding: one step with a key/value cache, and the top-k and top-p filters of sampling.

The cache step is checked against each backend's own ``KeyValueCache`` and attention. The
filters are checked against ``transformer_run.decoding.filter_logits``: the search and the
sampler are written once, in NumPy, and shared by the three backends (each backend supplies
only the logits), so that one function is every backend's own code there.
"""

from __future__ import annotations

import numpy as np

from transformer_run.decoding import filter_logits

from ..check import Exercise, Mistake


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ kv_cache_step
def _cache_step_case(rng: np.random.Generator, batch: int, heads: int, slots: int, d_k: int, position: int):
    k_cache = np.zeros((batch, heads, slots, d_k))  # (B, H, max_len, d_k): the slots not written yet hold zeros
    v_cache = np.zeros((batch, heads, slots, d_k))
    k_cache[:, :, :position] = rng.standard_normal((batch, heads, position, d_k))  # the earlier steps' keys
    v_cache[:, :, :position] = rng.standard_normal((batch, heads, position, d_k))
    new = {name: rng.standard_normal((batch, heads, 1, d_k)) for name in ("q", "k_new", "v_new")}
    return {**new, "k_cache": k_cache, "v_cache": v_cache, "position": position}


def _cache_step_cases():
    rng = np.random.default_rng(14)
    return [
        ("B = 2, 3 heads of d_k = 4, a buffer of 8 slots, step at position 3", _cache_step_case(rng, 2, 3, 8, 4, 3)),
        ("the first step (position 0): the cache holds nothing yet", _cache_step_case(rng, 1, 2, 6, 4, 0)),
        ("the last slot (position 5 of 6): the buffer is full after this step", _cache_step_case(rng, 1, 2, 6, 2, 5)),
    ]


def _cache_step_expected(b, x):
    """Each backend's own cache: NumPy and torch grow it by concatenation (it holds ``position``
    entries), JAX writes into a buffer of every slot and hides the slots after the query. The answer:
    the context, and what the two buffers hold after the step (the task writes into them)."""
    position, slots = x["position"], x["k_cache"].shape[2]
    KeyValueCache = b.impl.attention.KeyValueCache  # noqa: N806 - the backend's class
    if b.name == "jax":  # a fixed-size buffer: the slots after ``position`` are masked out
        cache = KeyValueCache(b.asarray(x["k_cache"]), b.asarray(x["v_cache"]))
        mask = b.asarray((np.arange(slots) <= position)[None, None, None, :])  # (1, 1, 1, slots)
    else:  # a growing array: only the filled part, nothing to hide
        cache = KeyValueCache(b.asarray(x["k_cache"][:, :, :position]), b.asarray(x["v_cache"][:, :, :position]))
        mask = None
    k, v = cache.update(b.asarray(x["k_new"]), b.asarray(x["v_new"]), position)  # (B, H, T_cache, d_k) each
    context, _ = b.impl.scaled_dot_product_attention(b.asarray(x["q"]), k, v, mask)  # (B, H, 1, d_k)
    buffers = {}
    for name, filled in (("k_cache", k), ("v_cache", v)):
        filled = b.to_numpy(filled)  # a growing cache's entries so far; JAX's, the whole buffer
        buffers[name] = np.concatenate([filled, x[name][:, :, filled.shape[2] :]], axis=2)  # (B, H, slots, d_k)
    return b.to_numpy(context), buffers


def _attend(q, k, v):
    return _softmax(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])) @ v  # (B, H, 1, d_k)


def _every_slot(q, k_new, v_new, k_cache, v_cache, position):
    k_cache[:, :, position], v_cache[:, :, position] = k_new[:, :, 0], v_new[:, :, 0]
    return _attend(q, k_cache, v_cache)  # the zero slots after position join the softmax


def _before_appending(q, k_new, v_new, k_cache, v_cache, position):
    return _attend(q, k_cache[:, :, :position], v_cache[:, :, :position])  # the new token's own key missing


def _on_copies(q, k_new, v_new, k_cache, v_cache, position):
    keys = np.concatenate([k_cache[:, :, :position], k_new], axis=2)  # new arrays: the buffers never change
    values = np.concatenate([v_cache[:, :, :position], v_new], axis=2)
    return _attend(q, keys, values)


# ------------------------------------------------------------------ top_k_filter
def _top_k_cases():
    rng = np.random.default_rng(15)
    ties = np.array([[2.0, 1.0, -1.0, 1.0, 0.5], [0.0, 3.0, -2.0, 1.0, 0.5]])  # 2nd largest tied / not
    top_tie = np.array([[3.0, 0.0, 3.0, -1.0, 1.0]])
    return [
        ("(2, 10) logits, k = 3", {"logits": 2.0 * rng.standard_normal((2, 10)), "k": 3}),
        ("a tie at the k-th largest (k = 2): both tied tokens stay", {"logits": ties, "k": 2}),
        ("k = 1 with two tokens tied for the top: both stay, half each", {"logits": top_tie, "k": 1}),
        ("k = V: nothing is filtered", {"logits": rng.standard_normal((1, 6)), "k": 6}),
    ]


def _renormalised(logits, keep):
    probs = np.where(keep, _softmax(logits), 0.0)
    with np.errstate(invalid="ignore"):  # a wrong answer that keeps nothing gives NaN, quietly
        return probs / probs.sum(axis=-1, keepdims=True)


def _exactly_k(logits, k):
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]  # k tokens, ties at the k-th cut off
    keep = np.zeros(logits.shape, bool)
    np.put_along_axis(keep, order, True, axis=-1)
    return _renormalised(logits, keep)


# ------------------------------------------------------------------ top_p_filter
def _top_p_cases():
    rng = np.random.default_rng(16)
    tie = np.log(np.array([[0.1, 0.2, 0.5, 0.2]]))  # sorted: 0.5, 0.2 (id 1), 0.2 (id 3), 0.1
    dominant = np.log(np.array([[0.05, 0.8, 0.15], [0.3, 0.3, 0.4]]))
    return [
        ("(2, 8) logits, p = 0.9", {"logits": 1.5 * rng.standard_normal((2, 8)), "top_p": 0.9}),
        ("p = 0.6 cuts between two equally probable tokens: the lower id stays", {"logits": tie, "top_p": 0.6}),
        ("p = 0.5 below the most probable token alone (first row): it stays, alone",
         {"logits": dominant, "top_p": 0.5}),  # fmt: skip
        ("p = 1: nothing is filtered", {"logits": rng.standard_normal((1, 5)), "top_p": 1.0}),
        ("p = 0.5 reached exactly by the most probable token (0.5, 0.25, 0.25): it stays, alone",
         {"logits": np.log(np.array([[0.5, 0.25, 0.25]])), "top_p": 0.5}),  # fmt: skip
    ]


def _nucleus(logits, top_p, crossing=True, order=None):
    probs = _softmax(logits)
    if order is None:
        order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    cumulative = np.cumsum(ranked, axis=-1)
    keep_ranked = (cumulative - ranked < top_p) if crossing else (cumulative < top_p)
    keep = np.zeros(probs.shape, bool)
    np.put_along_axis(keep, order, keep_ranked, axis=-1)
    return keep


EXERCISES = [
    Exercise(
        name="kv_cache_step",
        chapter="14_decoding",
        task="kv_cache_step(q, k_new, v_new, k_cache, v_cache, position) -> context (B, H, 1, d_k): write the "
        "new key and value into slot `position` of the (B, H, max_len, d_k) buffers, then attend the query "
        "over slots 0 .. position.",
        cases=_cache_step_cases,
        expected=_cache_step_expected,
        writes=("k_cache", "v_cache"),  # the next step reads what this one wrote: the buffers are compared too
        mistakes=(
            Mistake(
                "attending over the unfilled slots",
                "the slots after `position` hold zeros, not keys: a zero key still scores 0 and takes a share "
                "of the softmax (and its zero value pulls the average towards 0). Attend over "
                "k_cache[:, :, :position + 1] only, or mask the later slots out (JAX's fixed-size cache does).",
                _every_slot,
            ),
            Mistake(
                "attending before appending",
                "the new token may attend to itself: write its key and value into slot `position` first, then "
                "attend over slots 0 .. position (position + 1 of them), as the causal mask's diagonal allows.",
                _before_appending,
            ),
            Mistake(
                "the buffers never written",
                "the context is right, but it was computed from new arrays (np.concatenate) and the cache's "
                "buffers still hold zeros in slot `position`: the next step would attend over a missing key. "
                "Assign into the buffers in place: k_cache[:, :, position : position + 1] = k_new.",
                _on_copies,
            ),
        ),
    ),
    Exercise(
        name="top_k_filter",
        chapter="14_decoding",
        task="top_k_filter(logits, k) -> probabilities (N, V): softmax over the k largest logits of each row "
        "(every logit equal to the k-th largest stays too), 0 elsewhere.",
        cases=_top_k_cases,
        expected=lambda b, x: filter_logits(x["logits"], top_k=x["k"]),
        mistakes=(
            Mistake(
                "ties at the k-th dropped",
                "a logit equal to the k-th largest stays (the threshold is a value: logits < kth are dropped, as "
                "in Hugging Face's top-k); cutting the sorted list after exactly k entries keeps one of two tied "
                "tokens by the accident of the sort.",
                _exactly_k,
            ),
            Mistake(
                "not renormalised",
                "the kept probabilities must sum to 1: take the softmax over the kept logits (or divide the "
                "zeroed probabilities by their sum), not the softmax over all V with the rest set to 0.",
                lambda logits, k: np.where(logits >= np.sort(logits, axis=-1)[:, -k][:, None], _softmax(logits), 0.0),
            ),
            Mistake(
                "the k-th smallest as the threshold",
                "np.sort is ascending: the k-th largest is np.sort(logits, axis=-1)[:, -k], not [:, k - 1] "
                "(which keeps V - k + 1 tokens).",
                lambda logits, k: _renormalised(logits, logits >= np.sort(logits, axis=-1)[:, k - 1][:, None]),
            ),
        ),
    ),
    Exercise(
        name="top_p_filter",
        chapter="14_decoding",
        task="top_p_filter(logits, top_p) -> probabilities (N, V): the smallest set of most probable tokens whose "
        "probability reaches top_p (the token that crosses it included; of equal probabilities the lower id "
        "first), renormalised; 0 elsewhere.",
        cases=_top_p_cases,
        expected=lambda b, x: filter_logits(x["logits"], top_p=x["top_p"]),
        mistakes=(
            Mistake(
                "the token that crosses p dropped",
                "the nucleus is the smallest set whose probability *reaches* p, so it includes the token whose "
                "cumulative probability crosses p: keep a token when the probability ranked above it is < p "
                "(cumsum - prob < p), not when its own cumsum is < p. Otherwise a token more probable than p "
                "alone leaves nothing to sample.",
                lambda logits, top_p: _renormalised(logits, _nucleus(logits, top_p, crossing=False)),
            ),
            Mistake(
                "ties broken towards the higher id",
                "of equally probable tokens the lower id ranks first (np.argsort(-probs, kind='stable')); "
                "reversing an ascending argsort puts the higher id first and keeps the other token of a tie "
                "at the cut.",
                lambda logits, top_p: _renormalised(
                    logits, _nucleus(logits, top_p, order=np.argsort(_softmax(logits), axis=-1, kind="stable")[:, ::-1])
                ),
            ),
            Mistake(
                "not renormalised",
                "the kept probabilities must sum to 1 again: divide them by their sum after zeroing the rest.",
                lambda logits, top_p: np.where(_nucleus(logits, top_p), _softmax(logits), 0.0),
            ),
        ),
    ),
]
