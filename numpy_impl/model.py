"""Whole models: encoder-decoder (the paper), decoder-only LM (the seeds), encoder-only (BERT)."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_spec import Config, ModelOutput
from transformer_spec.checks import check_model_kind
from transformer_spec.trace import record

from .decoder import Decoder
from .embeddings import Embeddings
from .encoder import Encoder
from .layers import Linear, Module, seed_dropout, with_prefix
from .masks import make_cross_attention_mask, make_decoder_mask, make_padding_mask
from .validate import check_token_ids


class Generator:
    """The pre-softmax projection d_model -> vocabulary; with ``tie_output`` it reuses the
    target embedding table, transposed (paper, section 3.4), and has no weights of its own.
    The model passes that table in on each call rather than the generator keeping a second
    reference to it (which JAX would see as two separate arrays)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.proj = None if config.tie_output else Linear(config.d_model, config.tgt_vocab_size, config.bias, dtype)

    def __call__(self, x: np.ndarray, embedding: np.ndarray) -> np.ndarray:
        return self.forward_for_backward(x, embedding)[0]

    def forward_for_backward(self, x: np.ndarray, embedding: np.ndarray) -> tuple[np.ndarray, Any]:
        if self.proj is None:
            logits, saved = x @ embedding.T, (x, embedding)  # (B, T, d_model) @ (d_model, V) -> (B, T, V)
        else:
            logits, saved = self.proj.forward_for_backward(x)  # (B, T, V)
        record(self, "logits", logits)
        return logits, saved

    def backward(
        self, saved: Any, grad_output: np.ndarray
    ) -> tuple[tuple[np.ndarray, np.ndarray | None], dict[str, np.ndarray]]:
        """grad_output (B, T, V) -> (grad_x (B, T, d_model), grad_embedding (V, d_model) when tied, else None),
        grads of the projection (none when tied: the model adds grad_embedding to the embedding's)."""
        if self.proj is None:
            x, embedding = saved  # (B, T, d_model), (V, d_model)
            # logits = x E^T: dx = dlogits E, dE = dlogits^T x summed over every position
            grad_x = grad_output @ embedding  # (B, T, V) @ (V, d_model) -> (B, T, d_model)
            rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (N, V)
            grad_embedding = rows_grad.T @ x.reshape(-1, x.shape[-1])  # (V, N) @ (N, d_model) -> (V, d_model)
            return (grad_x, grad_embedding), {}
        grad_x, proj_grads = self.proj.backward(saved, grad_output)  # (B, T, d_model)
        return (grad_x, None), with_prefix("proj", proj_grads)


class Transformer(Module):
    """Encoder-decoder: src ids -> memory; tgt ids (shifted right) + memory -> next-token logits."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        check_model_kind("Transformer", "encoder_decoder", config.kind)
        self.config = config
        self.src_embed = Embeddings(config, dtype, config.src_vocab_size)
        self.encoder = Encoder(config, dtype)
        self.tgt_embed = Embeddings(config, dtype, config.tgt_vocab_size)
        self.decoder = Decoder(config, dtype)
        self.generator = Generator(config, dtype)
        seed_dropout(self, 0)  # every Dropout its own generator (they would otherwise all start alike)

    def encode(self, src_ids, src_mask=None, need_weights=False, need_hidden_states=False):
        """(B, T_src) -> memory (B, T_src, d_model), hidden states, attention weights."""
        return self.encode_for_backward(src_ids, src_mask, need_weights, need_hidden_states, save=False)[0]

    def encode_for_backward(self, src_ids, src_mask=None, need_weights=False, need_hidden_states=False, save=True):
        if src_mask is None:
            src_mask = make_padding_mask(src_ids, self.config.pad_id)  # (B, 1, 1, T_src)
        x, src_embed_saved = self.src_embed.forward_for_backward(src_ids)  # (B, T_src, d_model)
        result, encoder_saved = self.encoder.forward_for_backward(x, src_mask, need_weights, need_hidden_states, save)
        return result, (src_embed_saved, encoder_saved)

    def decode(self, tgt_ids, memory, tgt_mask=None, memory_mask=None, need_weights=False, need_hidden_states=False):
        """(B, T_tgt) + memory -> (B, T_tgt, d_model), hidden states, self and cross weights."""
        return self.decode_for_backward(
            tgt_ids, memory, tgt_mask, memory_mask, need_weights, need_hidden_states, save=False
        )[0]

    def decode_for_backward(
        self, tgt_ids, memory, tgt_mask=None, memory_mask=None, need_weights=False, need_hidden_states=False, save=True
    ):
        if tgt_mask is None:
            tgt_mask = make_decoder_mask(tgt_ids, self.config.pad_id)  # (B, 1, T_tgt, T_tgt)
        x, tgt_embed_saved = self.tgt_embed.forward_for_backward(tgt_ids)  # (B, T_tgt, d_model)
        result, decoder_saved = self.decoder.forward_for_backward(
            x, memory, tgt_mask, memory_mask, need_weights, need_hidden_states, save
        )
        return result, (tgt_embed_saved, decoder_saved)

    def __call__(
        self,
        src_ids: np.ndarray,
        tgt_ids: np.ndarray,
        src_mask: np.ndarray | None = None,
        tgt_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        """Masks left as None are built from the ids and ``config.pad_id``: source padding for
        the encoder and for cross-attention, causal AND target padding for the decoder."""
        return self.forward_for_backward(
            src_ids, tgt_ids, src_mask, tgt_mask, memory_mask, return_attentions, return_hidden_states, save=False
        )[0]

    def forward_for_backward(
        self,
        src_ids: np.ndarray,
        tgt_ids: np.ndarray,
        src_mask: np.ndarray | None = None,
        tgt_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
        save: bool = True,
    ) -> tuple[ModelOutput, tuple]:
        """``__call__`` plus what ``backward`` needs; ``save=False`` keeps none of it (inference)."""
        check_token_ids("src_ids", src_ids, self.config.src_vocab_size, self.config.max_len)
        check_token_ids("tgt_ids", tgt_ids, self.config.tgt_vocab_size, self.config.max_len)
        (memory, encoder_hidden, encoder_attentions), encode_saved = self.encode_for_backward(
            src_ids, src_mask, return_attentions, return_hidden_states, save
        )  # (B, T_src, d_model), ...
        if memory_mask is None:
            memory_mask = make_cross_attention_mask(src_ids, self.config.pad_id)  # (B, 1, 1, T_src)
        (x, hidden, self_attentions, cross_attentions), decode_saved = self.decode_for_backward(
            tgt_ids, memory, tgt_mask, memory_mask, return_attentions, return_hidden_states, save
        )  # (B, T_tgt, d_model), ...
        logits, generator_saved = self.generator.forward_for_backward(x, self.tgt_embed.token.weight)
        output = ModelOutput(
            logits=logits,  # (B, T_tgt, tgt_vocab)
            last_hidden_state=x,
            hidden_states=hidden,
            attentions=self_attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=memory,
            encoder_hidden_states=encoder_hidden,
            encoder_attentions=encoder_attentions,
        )
        return output, (encode_saved, decode_saved, generator_saved)

    def backward(self, saved: tuple, grad_logits: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        """grad_logits (B, T_tgt, tgt_vocab) -> (None: ids have no gradient, a gradient for every
        parameter, named as in ``param_schema``). The forward pass, run backwards."""
        (src_embed_saved, encoder_saved), (tgt_embed_saved, decoder_saved), generator_saved = saved
        # (B, T_tgt, d_model), and (tgt_vocab, d_model) when the output is tied to the target table
        (grad_x, grad_tied), generator_grads = self.generator.backward(generator_saved, grad_logits)
        # (B, T_tgt, d_model), (B, T_src, d_model): the memory's gradient summed over the decoder layers
        (grad_x, grad_memory), decoder_grads = self.decoder.backward(decoder_saved, grad_x)
        _, tgt_embed_grads = self.tgt_embed.backward(tgt_embed_saved, grad_x)
        grad_x, encoder_grads = self.encoder.backward(encoder_saved, grad_memory)  # (B, T_src, d_model)
        _, src_embed_grads = self.src_embed.backward(src_embed_saved, grad_x)
        if grad_tied is not None:  # tied output: the target table was used twice, its gradients add up
            tgt_embed_grads["token.weight"] = tgt_embed_grads["token.weight"] + grad_tied
        grads = (
            with_prefix("src_embed", src_embed_grads)
            | with_prefix("encoder", encoder_grads)
            | with_prefix("tgt_embed", tgt_embed_grads)
            | with_prefix("decoder", decoder_grads)
            | with_prefix("generator", generator_grads)
        )
        return None, grads


class TransformerLM(Module):
    """Decoder-only causal language model: ids -> next-token logits at every position."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        check_model_kind("TransformerLM", "decoder_only", config.kind)
        self.config = config
        self.tgt_embed = Embeddings(config, dtype, config.tgt_vocab_size)
        self.decoder = Decoder(config, dtype)
        self.generator = Generator(config, dtype)
        seed_dropout(self, 0)  # every Dropout its own generator (they would otherwise all start alike)

    def __call__(
        self,
        ids: np.ndarray,
        mask: np.ndarray | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        return self.forward_for_backward(ids, mask, return_attentions, return_hidden_states, save=False)[0]

    def forward_for_backward(
        self,
        ids: np.ndarray,
        mask: np.ndarray | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
        save: bool = True,
    ) -> tuple[ModelOutput, tuple]:
        """``__call__`` plus what ``backward`` needs; ``save=False`` keeps none of it (inference)."""
        check_token_ids("ids", ids, self.config.tgt_vocab_size, self.config.max_len)
        if mask is None:
            mask = make_decoder_mask(ids, self.config.pad_id)  # (B, 1, T, T)
        x, tgt_embed_saved = self.tgt_embed.forward_for_backward(ids)  # (B, T, d_model)
        (x, hidden, attentions, _), decoder_saved = self.decoder.forward_for_backward(
            x, None, mask, None, return_attentions, return_hidden_states, save
        )  # (B, T, d_model), ...
        logits, generator_saved = self.generator.forward_for_backward(x, self.tgt_embed.token.weight)  # (B, T, V)
        output = ModelOutput(
            logits=logits,
            last_hidden_state=x,
            hidden_states=hidden,
            attentions=attentions,
        )
        return output, (tgt_embed_saved, decoder_saved, generator_saved)

    def backward(self, saved: tuple, grad_logits: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        """grad_logits (B, T, tgt_vocab) -> (None: ids have no gradient, a gradient for every
        parameter, named as in ``param_schema``)."""
        tgt_embed_saved, decoder_saved, generator_saved = saved
        # (B, T, d_model), and (tgt_vocab, d_model) when the output is tied to the table
        (grad_x, grad_tied), generator_grads = self.generator.backward(generator_saved, grad_logits)
        (grad_x, _), decoder_grads = self.decoder.backward(decoder_saved, grad_x)  # (B, T, d_model), no memory
        _, tgt_embed_grads = self.tgt_embed.backward(tgt_embed_saved, grad_x)
        if grad_tied is not None:  # tied output: the table was used twice, its gradients add up
            tgt_embed_grads["token.weight"] = tgt_embed_grads["token.weight"] + grad_tied
        grads = (
            with_prefix("tgt_embed", tgt_embed_grads)
            | with_prefix("decoder", decoder_grads)
            | with_prefix("generator", generator_grads)
        )
        return None, grads


class Pooler:
    """BERT's pooler: tanh(h_first @ W + b), the first ([CLS]) token's final vector through a
    dense layer. Trained on next-sentence prediction; sentence embeddings usually mean-pool
    ``last_hidden_state`` instead."""

    def __init__(self, config: Config, dtype: str = "float32"):
        self.proj = Linear(config.d_model, config.d_model, config.bias, dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        pooled = np.tanh(self.proj(x[:, 0]))  # (B, T, d_model) -> (B, d_model)
        record(self, "output", pooled)
        return pooled


class TransformerEncoderModel(Module):
    """Encoder-only (BERT-style): ids (+ token types) -> contextual vectors."""

    schema = "model"

    def __init__(self, config: Config, dtype: str = "float32"):
        check_model_kind("TransformerEncoderModel", "encoder_only", config.kind)
        self.config = config
        self.src_embed = Embeddings(config, dtype, config.src_vocab_size)
        self.encoder = Encoder(config, dtype)
        self.pooler = Pooler(config, dtype) if config.pooler else None
        seed_dropout(self, 0)  # every Dropout its own generator (they would otherwise all start alike)

    def __call__(
        self,
        ids: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        mask: np.ndarray | None = None,
        return_attentions: bool = False,
        return_hidden_states: bool = False,
    ) -> ModelOutput:
        check_token_ids("ids", ids, self.config.src_vocab_size, self.config.max_len)
        if mask is None:
            mask = make_padding_mask(ids, self.config.pad_id)  # (B, 1, 1, T)
        x, hidden, attentions = self.encoder(
            self.src_embed(ids, token_type_ids), mask, return_attentions, return_hidden_states
        )
        pooled = self.pooler(x) if self.pooler is not None else None  # (B, d_model)
        return ModelOutput(last_hidden_state=x, hidden_states=hidden, attentions=attentions, pooler_output=pooled)


MODEL_CLASSES = {
    "encoder_decoder": Transformer,
    "decoder_only": TransformerLM,
    "encoder_only": TransformerEncoderModel,
}
