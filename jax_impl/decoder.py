"""Decoder layer and stack (paper, section 3.1, right half of figure 1)."""

from __future__ import annotations

import jax
from flax import nnx

from transformer_spec import Config
from transformer_spec.checks import check_hidden, check_same_batch

from .attention import MultiHeadAttention
from .feed_forward import PositionwiseFeedForward
from .layer_norm import LayerNorm
from .sublayer import sublayer_connection


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention over the encoder's memory, feed-forward.

    A decoder-only model (``kind="decoder_only"``) has no memory and no cross-attention.
    """

    schema = "decoder_layer"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.self_attn = MultiHeadAttention(config, dtype)
        self.self_attn_norm = LayerNorm(config, dtype)
        if config.decoder_has_cross_attention:
            self.cross_attn = MultiHeadAttention(config, dtype)
            self.cross_attn_norm = LayerNorm(config, dtype)
        self.ffn = PositionwiseFeedForward(config, dtype)
        self.ffn_norm = LayerNorm(config, dtype)

    def __call__(
        self,
        x: jax.Array,
        memory: jax.Array | None = None,
        tgt_mask: jax.Array | None = None,
        memory_mask: jax.Array | None = None,
        need_weights: bool = False,
    ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
        """x (B, T_tgt, d_model), memory (B, T_src, d_model), tgt_mask (B|1, 1, T_tgt, T_tgt),
        memory_mask (B|1, 1, T_tgt|1, T_src) -> (B, T_tgt, d_model), self weights, cross weights."""
        check_hidden("x", x.shape, self.config.d_model)
        norm_first = self.config.norm_first
        x, self_weights = sublayer_connection(
            x, lambda h: self.self_attn(h, h, h, tgt_mask, need_weights), self.self_attn_norm, norm_first
        )  # (B, T_tgt, d_model), (B, H, T_tgt, T_tgt) or None
        cross_weights = None
        if self.config.decoder_has_cross_attention:
            _check_memory(memory, x, self.config.d_model)
            # queries from the decoder, keys and values from the encoder: (B, T_tgt, T_src) scores
            x, cross_weights = sublayer_connection(
                x,
                lambda h: self.cross_attn(h, memory, memory, memory_mask, need_weights),
                self.cross_attn_norm,
                norm_first,
            )  # (B, T_tgt, d_model), (B, H, T_tgt, T_src) or None
        x, _ = sublayer_connection(x, lambda h: (self.ffn(h), None), self.ffn_norm, norm_first)  # (B, T_tgt, d_model)
        return x, self_weights, cross_weights


def _check_memory(memory: jax.Array | None, x: jax.Array, d_model: int) -> None:
    if memory is None:
        raise ValueError("this decoder has cross-attention and needs memory (the encoder output), got None")
    check_hidden("memory", memory.shape, d_model)
    check_same_batch(("memory", "x"), (memory.shape, x.shape))


class Decoder(nnx.Module):
    """N decoder layers, then an optional final LayerNorm (layers in an ``nnx.List``, unrolled under jit)."""

    schema = "decoder"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.layers = nnx.List([DecoderLayer(config, dtype) for _ in range(config.num_decoder_layers)])
        self.norm = LayerNorm(config, dtype) if config.use_decoder_final_norm else None

    def __call__(
        self,
        x: jax.Array,
        memory: jax.Array | None = None,
        tgt_mask: jax.Array | None = None,
        memory_mask: jax.Array | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
    ) -> tuple[jax.Array, tuple, tuple, tuple]:
        """-> (output, hidden states, self-attention weights per layer, cross-attention weights per layer)."""
        hidden_states, self_attentions, cross_attentions = [x], [], []
        for layer in self.layers:
            # (B, T_tgt, d_model), (B, H, T_tgt, T_tgt) or None, (B, H, T_tgt, T_src) or None
            x, self_weights, cross_weights = layer(x, memory, tgt_mask, memory_mask, need_weights)
            hidden_states.append(x)
            self_attentions.append(self_weights)
            cross_attentions.append(cross_weights)
        if self.norm is not None:
            x = self.norm(x)  # (B, T_tgt, d_model)
        if not need_weights:
            self_attentions, cross_attentions = [], []
        elif not self.config.decoder_has_cross_attention:
            cross_attentions = []
        return x, (tuple(hidden_states) if need_hidden_states else ()), tuple(self_attentions), tuple(cross_attentions)
