"""Whole models: encoder-decoder (the paper), decoder-only LM, encoder-only (BERT)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax.nnx import Module
from jax import Array

from transformer_spec import Config, ModelOutput
from transformer_spec.checks import (
    check_model_kind,
    check_no_token_types,
    check_same_batch,
    check_same_shape,
)
from transformer_spec.trace import record

from .checks import attention_mask, token_ids
from .decoder import Decoder
from .embeddings import Embeddings
from .encoder import Encoder
from .layers import Linear, parameter, seed_dropout
from .masks import make_cross_attention_mask, make_decoder_mask, make_padding_mask, make_target_mask

# ModelOutput is a plain dataclass in transformer_spec (which imports no framework); as a
# pytree, a jit-compiled forward can return it as it is.
jax.tree_util.register_dataclass(
    ModelOutput, data_fields=[f.name for f in dataclasses.fields(ModelOutput)], meta_fields=[]
)


class Generator(Module):
    """The pre-softmax projection d_model -> vocabulary; with ``tie_output`` it reuses the
    target embedding table, transposed (paper, section 3.4), and has no weights of its own.
    The model passes that table in on each call rather than the generator keeping a second
    reference to it: a model handed to ``jax.jit`` is flattened as a pytree, where a shared
    submodule would appear as two separate arrays. With ``final_logits_bias`` a bias vector
    is added to the logits, tied or not (Marian).
    """

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        vocab = config.tgt_vocab_size
        self.proj = None if config.tie_output else Linear(config.d_model, vocab, config.bias, dtype)
        bias = parameter((vocab,), dtype) if config.final_logits_bias else None  # (V,)
        self.logits_bias = bias

    def __call__(self, x: Array, embedding: Array) -> Array:
        if self.proj is None:
            logits = x @ embedding.T  # (B, T, d_model) @ (d_model, V) -> (B, T, V)
        else:
            logits = self.proj(x)  # (B, T, V)
        if self.logits_bias is not None:
            logits = logits + self.logits_bias[...]  # (B, T, V)
        record(self, logits=logits)
        return logits


class Transformer(Module):
    """Encoder-decoder: src ids -> memory; tgt ids (shifted right) + memory -> next-token logits."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        check_model_kind("Transformer", "encoder_decoder", config.kind)
        self.config = config
        # share_embeddings: no source table of its own, the encoder reads the target's
        self.src_embed = Embeddings(config, dtype, config.src_vocab_size, config.share_embeddings)
        self.encoder = Encoder(config, dtype)
        self.tgt_embed = Embeddings(config, dtype, config.tgt_vocab_size)
        self.decoder = Decoder(config, dtype)
        self.generator = Generator(config, dtype)
        seed_dropout(self, 0)  # differs: dropout-streams

    def encode(self, src_ids, src_mask=None, need_weights=False, need_hidden_states=False):
        """(B, T_src) -> memory (B, T_src, d_model), hidden states, attention weights."""
        if src_mask is None:
            src_mask = make_padding_mask(src_ids, self.config.pad_id)  # (B, 1, 1, T_src)
        # share_embeddings: the target's (V, d_model) table; else None, the source's own
        shared = self.tgt_embed.token.weight if self.config.share_embeddings else None
        x = self.src_embed(src_ids, table=shared)  # (B, T_src, d_model)
        # (B, T_src, d_model), hidden states, attention weights
        return self.encoder(x, src_mask, need_weights, need_hidden_states)

    def decode(
        self,
        tgt_ids,
        memory,
        tgt_mask=None,
        memory_mask=None,
        need_weights=False,
        need_hidden_states=False,
    ):
        """(B, T_tgt) + memory -> (B, T_tgt, d_model), hidden states, self and cross weights."""
        if tgt_mask is None:
            tgt_mask = make_target_mask(tgt_ids, self.config.pad_id)  # (B, 1, T_tgt, T_tgt)
        x = self.tgt_embed(tgt_ids)  # (B, T_tgt, d_model)
        # (B, T_tgt, d_model), hidden states, self and cross weights
        return self.decoder(x, memory, tgt_mask, memory_mask, need_weights, need_hidden_states)

    def check_inputs(
        self, src_ids, tgt_ids, src_mask=None, tgt_mask=None, memory_mask=None
    ) -> tuple:
        """Every input, checked in the order the forward meets them -> the same inputs as this
        backend's arrays (lists, tuples and other frameworks' arrays converted)."""
        src_ids = token_ids(
            "src_ids", src_ids, self.config.src_vocab_size, self.config.max_len, self
        )  # (B, T_src)
        tgt_ids = token_ids(
            "tgt_ids", tgt_ids, self.config.tgt_vocab_size, self.config.max_len, self
        )  # (B, T_tgt)
        (b_src, t_src), (b_tgt, t_tgt), heads = src_ids.shape, tgt_ids.shape, self.config.num_heads
        # the encoder's self-attention mask, then the decoder's
        src_mask = attention_mask("src_mask", src_mask, (b_src, heads, t_src, t_src), self)
        tgt_mask = attention_mask("tgt_mask", tgt_mask, (b_tgt, heads, t_tgt, t_tgt), self)
        memory_shape = (b_src, t_src, self.config.d_model)
        x_shape = (b_tgt, t_tgt, self.config.d_model)
        check_same_batch(("memory", "x"), (memory_shape, x_shape))  # the decoder's cross-attention
        memory_mask = attention_mask("memory_mask", memory_mask, (b_tgt, heads, t_tgt, t_src), self)
        return src_ids, tgt_ids, src_mask, tgt_mask, memory_mask

    def __call__(
        self,
        src_ids: Array,
        tgt_ids: Array,
        src_mask: Array | None = None,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        """Masks left as None are built from the ids and ``config.pad_id``: source padding for
        the encoder and for cross-attention, causal AND target padding for the decoder."""
        src_ids, tgt_ids, src_mask, tgt_mask, memory_mask = self.check_inputs(
            src_ids, tgt_ids, src_mask, tgt_mask, memory_mask
        )  # (B, T_src), (B, T_tgt), masks or None: checked and converted once, here
        memory, encoder_hidden, encoder_attentions = self.encode(
            src_ids, src_mask, return_attentions, return_hidden_states
        )  # (B, T_src, d_model), ...
        if memory_mask is None:
            memory_mask = make_cross_attention_mask(src_ids, self.config.pad_id)  # (B, 1, 1, T_src)
        x, hidden, self_attentions, cross_attentions = self.decode(
            tgt_ids, memory, tgt_mask, memory_mask, return_attentions, return_hidden_states
        )  # (B, T_tgt, d_model), ...
        return ModelOutput(
            logits=self.generator(x, self.tgt_embed.token.weight[...]),  # (B, T_tgt, tgt_vocab)
            last_hidden_state=x,
            hidden_states=hidden,
            attentions=self_attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=memory,
            encoder_hidden_states=encoder_hidden,
            encoder_attentions=encoder_attentions,
        )


class TransformerLM(Module):
    """Decoder-only causal language model: ids -> next-token logits at every position."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        check_model_kind("TransformerLM", "decoder_only", config.kind)
        self.config = config
        self.tgt_embed = Embeddings(config, dtype, config.tgt_vocab_size)
        self.decoder = Decoder(config, dtype)
        self.generator = Generator(config, dtype)
        seed_dropout(self, 0)  # differs: dropout-streams

    def check_inputs(self, ids, mask=None) -> tuple:
        """Every input, checked -> the same inputs as this backend's arrays (see Transformer's)."""
        ids = token_ids("ids", ids, self.config.tgt_vocab_size, self.config.max_len, self)  # (B, T)
        batch, seq_len = ids.shape
        mask = attention_mask("mask", mask, (batch, self.config.num_heads, seq_len, seq_len), self)
        return ids, mask

    def __call__(
        self,
        ids: Array,
        mask: Array | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        ids, mask = self.check_inputs(ids, mask)  # (B, T), mask or None: checked once, here
        if mask is None:
            mask = make_decoder_mask(ids, self.config.pad_id)  # (B, 1, T, T)
        x, hidden, attentions, _ = self.decoder(
            self.tgt_embed(ids), None, mask, None, return_attentions, return_hidden_states
        )  # (B, T, d_model), ...
        return ModelOutput(
            logits=self.generator(x, self.tgt_embed.token.weight[...]),  # (B, T, tgt_vocab)
            last_hidden_state=x,
            hidden_states=hidden,
            attentions=attentions,
        )


class Pooler(Module):
    """BERT's pooler: tanh(h_first @ W + b), the first ([CLS]) token's final vector through a
    dense layer. Trained on next-sentence prediction; sentence embeddings usually mean-pool
    ``last_hidden_state`` instead."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.proj = Linear(config.d_model, config.d_model, config.bias, dtype)

    def __call__(self, x: Array) -> Array:
        pooled = jnp.tanh(self.proj(x[:, 0]))  # (B, T, d_model) -> (B, d_model)
        record(self, output=pooled)
        return pooled


class TransformerEncoderModel(Module):
    """Encoder-only (BERT-style): ids (+ token types) -> contextual vectors."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        check_model_kind("TransformerEncoderModel", "encoder_only", config.kind)
        self.config = config
        self.src_embed = Embeddings(config, dtype, config.src_vocab_size)
        self.encoder = Encoder(config, dtype)
        self.pooler = Pooler(config, dtype) if config.pooler else None
        seed_dropout(self, 0)  # differs: dropout-streams

    def check_inputs(self, ids, token_type_ids=None, mask=None) -> tuple:
        """Every input, checked -> the same inputs as this backend's arrays (see Transformer's)."""
        ids = token_ids("ids", ids, self.config.src_vocab_size, self.config.max_len, self)  # (B, T)
        if self.src_embed.token_type is None:
            if token_type_ids is not None:
                check_no_token_types()
        elif token_type_ids is not None:  # None becomes zeros: always in range
            token_type_ids = token_ids(
                "token_type_ids", token_type_ids, self.config.type_vocab_size, None, self
            )
            check_same_shape(("token_type_ids", "ids"), (token_type_ids.shape, ids.shape))
        batch, seq_len = ids.shape
        mask = attention_mask("mask", mask, (batch, self.config.num_heads, seq_len, seq_len), self)
        return ids, token_type_ids, mask

    def __call__(
        self,
        ids: Array,
        token_type_ids: Array | None = None,
        mask: Array | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        ids, token_type_ids, mask = self.check_inputs(ids, token_type_ids, mask)  # (B, T) each
        if mask is None:
            mask = make_padding_mask(ids, self.config.pad_id)  # (B, 1, 1, T)
        x, hidden, attentions = self.encoder(
            self.src_embed(ids, token_type_ids), mask, return_attentions, return_hidden_states
        )  # (B, T, d_model), ...
        pooled = self.pooler(x) if self.pooler is not None else None  # (B, d_model)
        return ModelOutput(
            last_hidden_state=x, hidden_states=hidden, attentions=attentions, pooler_output=pooled
        )


MODEL_CLASSES = {
    "encoder_decoder": Transformer,
    "decoder_only": TransformerLM,
    "encoder_only": TransformerEncoderModel,
}
