"""Token embeddings and the embedding block (token + position [+ token type] [-> LayerNorm])."""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax.nnx import Module
from jax import Array

from transformer_spec import Config
from transformer_spec.checks import check_no_token_types, check_same_shape, check_table
from transformer_spec.trace import record

from .checks import token_ids
from .layer_norm import make_norm
from .layers import Dropout, parameter
from .positional import LearnedPositionalEmbedding, Position, SinusoidalPositionalEncoding


class TokenEmbedding(Module):
    """A (vocab, d_model) lookup table, optionally scaled by sqrt(d_model).

    The paper multiplies by sqrt(d_model) (section 3.4) so that embeddings drawn with
    std d_model**-0.5 are not drowned by the unit-amplitude positional sinusoids.

    Not Flax's ``nnx.Embed``: its table is called ``embedding`` (ours keeps the canonical
    ``weight``) and its lookup returns a row of NaN for an id past the end and wraps a
    negative one (``jnp.take``'s default mode, "fill"); the models here refuse both first.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        scale: bool,
        dtype: str = "float32",
        shared: bool = False,
    ):
        super().__init__()
        # shared: no table of its own; the model passes another one's on each call
        self.weight = None if shared else parameter((vocab_size, d_model), dtype)
        self.scale = math.sqrt(d_model) if scale else 1.0  # a Python float: keeps the dtype

    def __call__(self, ids: Array, table: Array | None = None) -> Array:
        check_table(self.weight, table)  # a model that shares it passes the table in
        weight = self.weight if table is None else table  # (vocab, d_model): own, or shared
        # JAX never raises on an out-of-range index: plain weight[ids] clamps (a bad id silently
        # reads the last row) and jnp.take wraps negative ids around, as NumPy does. The ids are
        # checked eagerly, but inside a trace their values are unknown: there "fill" makes an id
        # outside [0, vocab) a row of NaN, loud, not silently wrong. (.at[].get rather than
        # jnp.take(mode="fill") for wrap_negative_indices=False: take would still wrap -1.)
        # (B, T) -> (B, T, d_model), NaN rows for ids outside the table; differs: jax-index-fill
        rows = weight[...].at[ids].get(mode="fill", fill_value=jnp.nan, wrap_negative_indices=False)
        return rows * self.scale  # (B, T, d_model)


class Embeddings(Module):
    """ids -> token embedding + positional encoding (+ token type) (-> LayerNorm)."""

    schema = "embeddings"

    def __init__(
        self,
        config: Config,
        dtype: str = "float32",
        vocab_size: int | None = None,
        shared_table: bool = False,
    ):
        """shared_table: the token table is another Embeddings' (``share_embeddings``), passed
        in on each call as ``table``."""
        super().__init__()
        self.config = config
        if vocab_size is None:
            vocab_size = config.src_vocab_size if config.uses_encoder else config.tgt_vocab_size
        self.vocab_size = vocab_size
        scale = config.scale_embeddings
        self.token = TokenEmbedding(self.vocab_size, config.d_model, scale, dtype, shared_table)
        # "rotary": in the attention; "none": a bag of words (permutation-equivariant)
        if config.positional == "sinusoidal":
            self.position = SinusoidalPositionalEncoding(config, dtype)
        elif config.positional == "learned":
            self.position = LearnedPositionalEmbedding(config, dtype)
        else:  # an optional submodule is set once, in every branch (Flax NNX needs that)
            self.position = None
        self.token_type = (
            TokenEmbedding(config.type_vocab_size, config.d_model, False, dtype)
            if config.type_vocab_size
            else None
        )
        self.norm = make_norm(config, dtype) if config.embedding_norm else None
        self.dropout = Dropout(config.dropout)

    def __call__(
        self,
        ids: Array,
        token_type_ids: Array | None = None,
        offset: Position = 0,
        table: Array | None = None,
    ) -> Array:
        ids = token_ids("ids", ids, self.vocab_size, self.config.max_len, self, offset)  # (B, T)
        x = self.token(ids, table)  # (B, T, d_model)
        record(self, token=x)
        if self.position is not None:
            position = self.position(ids.shape[1], offset)  # (T, d_model)
            record(self, position=position)
            x = x + position[None]  # + (1, T, d_model)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = jnp.zeros_like(ids)  # (B, T)
            type_vocab = self.config.type_vocab_size
            # (B, T)
            token_type_ids = token_ids("token_type_ids", token_type_ids, type_vocab, None, self)
            check_same_shape(("token_type_ids", "ids"), (token_type_ids.shape, ids.shape))
            token_type = self.token_type(token_type_ids)  # (B, T, d_model)
            record(self, token_type=token_type)
            x = x + token_type  # + (B, T, d_model)
        elif token_type_ids is not None:
            check_no_token_types()
        if self.norm is not None:
            x = self.norm(x)  # (B, T, d_model)
        x = self.dropout(x)  # (B, T, d_model)
        record(self, output=x)
        return x
