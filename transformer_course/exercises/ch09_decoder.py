"""Chapter 9, the decoder: the encoder-decoder's target mask, the cross-attention mask, and one decoder layer
from its parts."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake
from .parts import Part, weights_under

PAD = 0


def _causal(seq_len: int) -> np.ndarray:
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))[None, None]  # (1, 1, T, T)


# ------------------------------------------------------------------ target_mask
def _target_mask_cases():
    return [
        ("start token 1, pad 0, sentence 1 padded on the right",
         {"tgt_ids": np.array([[1, 5, 7, 0, 0], [1, 4, 8, 6, 2]]), "pad_id": 0}),
        ("Marian: the start token is the pad token (pad_id = 3)",
         {"tgt_ids": np.array([[3, 9, 4, 3, 3], [3, 6, 5, 8, 7]]), "pad_id": 3}),
        ("the first decoding step: the start token alone, pad_id = 3", {"tgt_ids": np.array([[3], [3]]), "pad_id": 3}),
    ]  # fmt: skip


def _not_padding(tgt_ids, pad_id):
    return tgt_ids != pad_id  # (B, T): the start position not spared


def _kept(tgt_ids, pad_id):
    return (tgt_ids != pad_id) | (np.arange(tgt_ids.shape[1]) == 0)  # (B, T): position 0 always kept


_TARGET_MASK = Exercise(
    name="target_mask",
    chapter="09_decoder",
    task="target_mask(tgt_ids, pad_id) -> (B, 1, T, T) bool: causal AND the key is not padding, except that "
    "position 0 (the start token) is never hidden, even where it equals pad_id.",
    cases=_target_mask_cases,
    expected=lambda b, x: b.call(b.impl.make_target_mask, x["tgt_ids"], x["pad_id"]),
    mistakes=(
        Mistake(
            "the start position hidden",
            "Marian and T5 start decoding from their pad token: hiding every key equal to pad_id hides the "
            "start token too, and the first query then attends to nothing at all. Keep position 0: "
            "(tgt_ids != pad_id) | (np.arange(T) == 0).",
            lambda tgt_ids, pad_id: _not_padding(tgt_ids, pad_id)[:, None, None, :] & _causal(tgt_ids.shape[1]),
        ),
        Mistake(
            "OR instead of AND",
            "a key is visible only when both masks allow it: combine them with &, not |. With |, every query "
            "sees every later real token, and the model learns to copy the answer.",
            lambda tgt_ids, pad_id: _kept(tgt_ids, pad_id)[:, None, None, :] | _causal(tgt_ids.shape[1]),
        ),
        Mistake(
            "padding hidden as queries instead of keys",
            "the mask hides padded *keys* (the last axis): keep[:, None, None, :], shape (B, 1, 1, T) before the "
            "AND. A padded query's row is never read; a padded key must never be read.",
            lambda tgt_ids, pad_id: _kept(tgt_ids, pad_id)[:, None, :, None] & _causal(tgt_ids.shape[1]),
        ),
    ),
)


# ------------------------------------------------------------------ cross_attention_mask
def _cross_cases():
    return [
        ("6 source tokens (sentence 1 padded), 4 target tokens",
         {"src_ids": np.array([[5, 7, 9, 4, 0, 0], [3, 4, 8, 6, 2, 1]]),
          "tgt_ids": np.array([[1, 6, 2, 8], [1, 9, 0, 0]]), "pad_id": 0}),
        ("source and target of the same length 5, padded differently",
         {"src_ids": np.array([[5, 7, 9, 0, 0], [3, 4, 8, 6, 2]]),
          "tgt_ids": np.array([[1, 6, 2, 8, 4], [1, 9, 7, 0, 0]]), "pad_id": 0}),
        ("the first decoding step: one target token, 3 source tokens, pad_id = 2",
         {"src_ids": np.array([[4, 8, 2], [6, 5, 9]]), "tgt_ids": np.array([[1], [1]]), "pad_id": 2}),
    ]  # fmt: skip


_CROSS_ATTENTION_MASK = Exercise(
    name="cross_attention_mask",
    chapter="09_decoder",
    task="cross_attention_mask(src_ids, tgt_ids, pad_id) -> (B, 1, 1, T_src) bool: the decoder's queries may "
    "attend to every source key that is not padding.",
    cases=_cross_cases,
    expected=lambda b, x: b.call(b.impl.make_cross_attention_mask, x["src_ids"], x["pad_id"]),
    mistakes=(
        Mistake(
            "the target length on the last axis",
            "cross-attention's keys are the *source* positions (the encoder's memory): the scores are "
            "(B, H, T_tgt, T_src), so the mask's last axis is T_src, built from src_ids. A mask built from the "
            "target has the wrong length, or, where the lengths happen to be equal, the wrong positions.",
            lambda src_ids, tgt_ids, pad_id: (tgt_ids != pad_id)[:, None, None, :],
        ),
        Mistake(
            "the mask's polarity",
            "True means *may attend*: src_ids != pad_id (torch.nn's memory_key_padding_mask is the opposite, "
            "True = padding).",
            lambda src_ids, tgt_ids, pad_id: (src_ids == pad_id)[:, None, None, :],
        ),
        Mistake(
            "a (B, 1, T_src, 1) mask",
            "the source positions are the keys, the last axis; the target positions (the queries, the third "
            "axis) all share one row: (src_ids != pad_id)[:, None, None, :].",
            lambda src_ids, tgt_ids, pad_id: (src_ids != pad_id)[:, None, :, None],
        ),
    ),
)


# ------------------------------------------------------------------ decoder_layer
LAYER_PARTS = {"self_attn": "MultiHeadAttention", "self_attn_norm": "LayerNorm", "cross_attn": "MultiHeadAttention",
               "cross_attn_norm": "LayerNorm", "ffn": "PositionwiseFeedForward", "ffn_norm": "LayerNorm"}  # fmt: skip


def _config(norm_first: bool) -> Config:
    # odd sizes: H = 3, d_k = 4, d_model = 12, d_ff = 10; target and source lengths differ
    return Config.preset("tiny").replace(d_model=12, num_heads=3, d_ff=10, norm_first=norm_first)


def _decoder_layer_cases():
    rng = np.random.default_rng(90)

    def case(tgt_ids, src_ids, norm_first, seed):
        config = _config(norm_first)
        params = init_params(config, seed=seed, dtype="float64", component="decoder_layer", nonzero_biases=True)
        parts = {name: Part(kind, config, weights_under(params, name)) for name, kind in LAYER_PARTS.items()}
        tgt_mask = _kept(tgt_ids, PAD)[:, None, None, :] & _causal(tgt_ids.shape[1])  # (B, 1, T_tgt, T_tgt)
        memory_mask = (src_ids != PAD)[:, None, None, :]  # (B, 1, 1, T_src)
        return {"x": rng.standard_normal((*tgt_ids.shape, config.d_model)),
                "memory": rng.standard_normal((*src_ids.shape, config.d_model)), "tgt_mask": tgt_mask,
                "memory_mask": memory_mask, "parts": parts, "norm_first": norm_first}  # fmt: skip

    tgt = np.array([[1, 5, 7, PAD], [1, 4, 8, 6]])
    src = np.array([[5, 7, 9, 4, PAD, PAD], [3, 4, 8, 6, 2, 9]])
    return [
        ("post-norm (the paper), 4 target and 6 source positions, padding in both",
         case(tgt, src, False, 1)),
        ("pre-norm, 5 target and 3 source positions", case(np.array([[1, 6, 2, 8, PAD], [1, 9, 7, 3, 5]]),
                                                           np.array([[4, 8, PAD], [6, 5, 9]]), True, 2)),
        ("the first decoding step: one target position, post-norm", case(tgt[:, :1], src, False, 3)),
    ]  # fmt: skip


def _decoder_layer_expected(b, x):
    parts = x["parts"]
    config = parts["ffn"].config.replace(norm_first=x["norm_first"])
    params = {f"{name}.{leaf}": value for name, part in parts.items() for leaf, value in part.params.items()}
    layer = b.build("DecoderLayer", config, params, "float64")
    return b.call(layer, x["x"], x["memory"], x["tgt_mask"], x["memory_mask"])[0]  # (B, T_tgt, d_model)


def _decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first, *, self_mask=True, cross_first=False,
                   norm_memory=False):  # fmt: skip
    """The decoder layer with one classic mistake switched on: the wrong answers below."""

    def connection(x, sublayer, norm):
        return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))

    def self_attention(h):
        return parts["self_attn"](h, h, h, tgt_mask if self_mask else None)

    def cross_attention(h):
        m = parts["cross_attn_norm"](memory) if norm_memory and norm_first else memory
        return parts["cross_attn"](h, m, m, memory_mask)

    order = [("cross_attn", cross_attention), ("self_attn", self_attention)]
    for name, sublayer in order if cross_first else order[::-1]:
        x = connection(x, sublayer, parts[f"{name}_norm"])
    return connection(x, parts["ffn"], parts["ffn_norm"])


def _layer_with(**mistake):
    def decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first):
        return _decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first, **mistake)

    return decoder_layer


EXERCISES = [
    _TARGET_MASK,
    _CROSS_ATTENTION_MASK,
    Exercise(
        name="decoder_layer",
        chapter="09_decoder",
        task="decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first) -> (B, T_tgt, d_model): masked "
        "self-attention over x, cross-attention from x to the memory (B, T_src, d_model), then the feed-forward "
        "network, each in a residual connection (post-norm, or pre-norm when norm_first). parts['self_attn'] and "
        "parts['cross_attn'] are called (query, key, value, mask); parts['ffn'] and the three norms (h).",
        cases=_decoder_layer_cases,
        expected=_decoder_layer_expected,
        mistakes=(
            Mistake(
                "the target mask not passed",
                "without the causal mask, each target position also attends to the tokens after it: in training "
                "it reads the very token it must predict. Pass tgt_mask to the self-attention.",
                _layer_with(self_mask=False),
            ),
            Mistake(
                "cross-attention before self-attention",
                "the paper's order is masked self-attention, then cross-attention, then the feed-forward network: "
                "each position first gathers what the target says so far, then asks the source with that.",
                _layer_with(cross_first=True),
            ),
            Mistake(
                "the memory normalised",
                "in pre-norm, the norm before a sub-layer normalises the decoder's own stream, the queries: "
                "parts['cross_attn'](norm(x), memory, memory, memory_mask). The memory arrives as the encoder "
                "left it (its final norm already applied) and goes in unchanged.",
                _layer_with(norm_memory=True),
            ),
        ),
    ),
]
