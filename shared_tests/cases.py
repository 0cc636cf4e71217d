"""Configurations and inputs the suite is parametrized over.

Sizes are deliberately odd and pairwise different (d_model 36, 3 heads of 12,
d_ff 37, source vocab 53, target vocab 47, batch 3, lengths 11 and 7) so that a
transposed weight or a broadcast over the wrong axis cannot hide behind equal sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import Config

TINY = Config.preset("tiny")

# name -> config: the model's switches (norm placement, activation, positions, bias, tied output,
# final norms, embedding scale), crossed enough that each is seen in both states.
VARIANTS = {
    "post-relu-sinusoidal": TINY,
    "pre-gelu-learned": TINY.replace(norm_first=True, activation="gelu", positional="learned"),
    "post-gelu_tanh-nobias": TINY.replace(activation="gelu_tanh", bias=False),
    "pre-relu-none-tied-nofinal": TINY.replace(
        norm_first=True, positional="none", tie_output=True, encoder_final_norm=False, decoder_final_norm=False
    ),
    "post-finalnorms-unscaled": TINY.replace(encoder_final_norm=True, decoder_final_norm=True, scale_embeddings=False),
}
# The paper's three-way sharing (section 3.4): one table for the source embedding, the target
# embedding and the output projection, over one vocabulary.
SHARED = TINY.replace(src_vocab_size=TINY.tgt_vocab_size, share_embeddings=True, tie_output=True)
DTYPES = ("float64", "float32")

# (batch, src_len, tgt_len, pad the batch to unequal lengths?)
SHAPES = {
    "padded-3x11x7": (3, 11, 7, True),
    "batch1": (1, 5, 4, False),
    "len1": (2, 1, 1, False),
}


def variant_params():
    return [pytest.param(VARIANTS[name], id=name) for name in VARIANTS]


def shape_params():
    return [pytest.param(SHAPES[name], id=name) for name in SHAPES]


def token_ids(vocab_size: int, batch: int, seq_len: int, pad: bool, pad_id: int = 0, seed: int = 0) -> np.ndarray:
    """Random non-pad ids; with ``pad`` the rows get unequal real lengths (the rest is pad_id)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab_size, size=(batch, seq_len))
    ids[ids == pad_id] = (pad_id + 1) % vocab_size
    if pad:
        for row in range(1, batch):
            real = max(1, seq_len - 3 * row)  # row 0 full, the others shorter and shorter
            ids[row, real:] = pad_id
    return ids


def hidden(batch: int, seq_len: int, d_model: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, seq_len, d_model))


def as_kind(config: Config, kind: str) -> Config:
    """The same switches in another model kind (decoder-only LM, BERT-style encoder)."""
    if kind == "decoder_only":
        return config.replace(kind=kind, num_encoder_layers=0, tgt_vocab_size=config.src_vocab_size)
    if kind == "encoder_only":
        return config.replace(
            kind=kind, num_decoder_layers=0, tie_output=False, decoder_final_norm=False, pooler=True,
            final_logits_bias=False,
        )  # fmt: skip
    return config


def model_inputs(config: Config, shape: tuple[int, int, int, bool]) -> tuple[np.ndarray, ...]:
    """Positional inputs of the model that ``config.kind`` names, as NumPy ids."""
    batch, src_len, tgt_len, pad = shape
    if config.kind == "encoder_decoder":
        src = token_ids(config.src_vocab_size, batch, src_len, pad, config.pad_id, seed=2)
        tgt = token_ids(config.tgt_vocab_size, batch, tgt_len, pad, config.pad_id, seed=1)
        return src, tgt
    vocab = config.tgt_vocab_size if config.kind == "decoder_only" else config.src_vocab_size
    return (token_ids(vocab, batch, src_len, pad, config.pad_id, seed=2),)


OUTPUT_FIELDS = (
    "logits",
    "last_hidden_state",
    "hidden_states",
    "attentions",
    "cross_attentions",
    "encoder_last_hidden_state",
    "encoder_hidden_states",
    "encoder_attentions",
    "pooler_output",
)


def flatten_output(output) -> dict[str, np.ndarray]:
    """ModelOutput -> {"hidden_states[2]": array, ...} for field-by-field comparison."""
    flat = {}
    for name in OUTPUT_FIELDS:
        value = getattr(output, name)
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                flat[f"{name}[{i}]"] = v
        elif value is not None:
            flat[name] = value
    return flat
