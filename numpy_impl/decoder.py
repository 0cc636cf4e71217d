"""Decoder layer and stack (paper, section 3.1, right half of figure 1)."""

from __future__ import annotations

from typing import NamedTuple

from numpy import ndarray as Array

from transformer_spec import Config
from transformer_spec.checks import check_hidden, check_same_batch
from transformer_spec.trace import record

from .attention import KeyValueCache, MultiHeadAttention
from .feed_forward import make_feed_forward
from .layer_norm import make_norm
from .layers import Dropout
from .module import Module, with_prefix
from .sublayer import sublayer_connection, sublayer_connection_backward
from .validate import check_float_inputs


class LayerCache(NamedTuple):
    """What one decoder layer keeps between decoding steps."""

    self_attn: KeyValueCache  # keys/values of every target token fed so far: (B, H, T_cache, d_k)
    cross_attn: KeyValueCache | None  # of the memory, computed once: (B, H, T_src, d_k); None when decoder-only


class DecoderLayer(Module):
    """Masked self-attention, cross-attention over the encoder's memory, feed-forward.

    A decoder-only model (``kind="decoder_only"``) has no memory and no cross-attention.
    """

    schema = "decoder_layer"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.self_attn = MultiHeadAttention(config, dtype)
        self.self_attn_norm = make_norm(config, dtype)
        self.self_attn_dropout = Dropout(config.dropout)  # on each sub-layer's output
        if config.decoder_has_cross_attention:
            self.cross_attn = MultiHeadAttention(config, dtype, rotary=False)  # positions: only within a sequence
            self.cross_attn_norm = make_norm(config, dtype)
            self.cross_attn_dropout = Dropout(config.dropout)
        self.ffn = make_feed_forward(config, dtype)
        self.ffn_norm = make_norm(config, dtype)
        self.ffn_dropout = Dropout(config.dropout)

    def __call__(
        self,
        x: Array,
        memory: Array | None = None,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
        need_weights: bool = False,
    ) -> tuple[Array, Array | None, Array | None]:
        """x (B, T_tgt, d_model), memory (B, T_src, d_model), tgt_mask (B|1, 1, T_tgt, T_tgt),
        memory_mask (B|1, 1, T_tgt|1, T_src) -> (B, T_tgt, d_model), self weights, cross weights."""
        check_hidden("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)
        norm_first = self.config.norm_first
        x, self_weights = sublayer_connection(
            x,
            lambda h: self.self_attn(h, h, h, tgt_mask, need_weights),
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T_tgt, d_model), (B, H, T_tgt, T_tgt) or None
        record(self, after_self_attn=x)
        cross_weights = None
        if self.config.decoder_has_cross_attention:
            _check_memory(memory, x, self.config.d_model)
            # queries from the decoder, keys and values from the encoder: (B, T_tgt, T_src) scores
            x, cross_weights = sublayer_connection(
                x,
                lambda h: self.cross_attn(h, memory, memory, memory_mask, need_weights),
                self.cross_attn_norm,
                norm_first,
                self.cross_attn_dropout,
            )  # (B, T_tgt, d_model), (B, H, T_tgt, T_src) or None
            record(self, after_cross_attn=x)
        x, _ = sublayer_connection(
            x, lambda h: (self.ffn(h), None), self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T_tgt, d_model)
        record(self, output=x)
        return x, self_weights, cross_weights

    def backward(self, grad_output: Array) -> tuple[tuple[Array, Array | None], dict[str, Array]]:
        """grad_output (B, T_tgt, d_model) -> (grad_x (B, T_tgt, d_model), grad_memory (B, T_src, d_model)
        or None without cross-attention), grads; the sub-layers in reverse order."""
        norm_first = self.config.norm_first
        grad_x, ffn_norm_grads, ffn_grads = sublayer_connection_backward(
            grad_output, self.ffn.backward, self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T_tgt, d_model)
        grads = with_prefix("ffn", ffn_grads) | with_prefix("ffn_norm", ffn_norm_grads)
        grad_memory = None
        if self.config.decoder_has_cross_attention:
            grad_x, cross_attn_norm_grads, (cross_attn_grads, grad_memory) = sublayer_connection_backward(
                grad_x,
                self._cross_attention_backward,
                self.cross_attn_norm,
                norm_first,
                self.cross_attn_dropout,
            )  # (B, T_tgt, d_model)
            grads |= with_prefix("cross_attn", cross_attn_grads) | with_prefix("cross_attn_norm", cross_attn_norm_grads)
        grad_x, self_attn_norm_grads, self_attn_grads = sublayer_connection_backward(
            grad_x,
            self.self_attn.self_attention_backward,
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T_tgt, d_model)
        grads |= with_prefix("self_attn", self_attn_grads) | with_prefix("self_attn_norm", self_attn_norm_grads)
        return (grad_x, grad_memory), grads

    def empty_cache(self, batch: int, memory: Array | None = None) -> LayerCache:
        """Before the first step: no target token yet; the memory's (B, T_src, d_model) keys and
        values projected once here, not again at every step."""
        cross_cache = None
        if self.config.decoder_has_cross_attention:
            if memory is None:
                raise ValueError("this decoder has cross-attention and needs memory (the encoder output), got None")
            cross_cache = self.cross_attn.key_value(memory)  # (B, H, T_src, d_k) each
        return LayerCache(self.self_attn.empty_cache(batch), cross_cache)  # (B, H, 0, d_k), (B, H, T_src, d_k)

    def step(
        self,
        x: Array,
        cache: LayerCache,
        position: int,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
    ) -> tuple[Array, LayerCache]:
        """``__call__`` for new tokens only. x (B, T_new, d_model): the tokens at positions
        position .. position + T_new - 1; ``cache``: this layer's keys and values of every
        earlier position; tgt_mask (B|1, 1, T_new, T_cache) over the cache *after* the new
        tokens join it -> (B, T_new, d_model), the extended cache."""
        check_hidden("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)
        norm_first = self.config.norm_first

        def self_attention(h: Array) -> tuple[Array, KeyValueCache]:
            self_cache = self.self_attn.extend_cache(cache.self_attn, h, position)  # (B, H, T_cache, d_k) each
            return self.self_attn.attend(h, self_cache, tgt_mask, position), self_cache  # (B, T_new, d_model)

        x, self_cache = sublayer_connection(
            x, self_attention, self.self_attn_norm, norm_first, self.self_attn_dropout
        )  # (B, T_new, d_model)
        if self.config.decoder_has_cross_attention:
            # the new queries over the memory's keys and values, projected once in ``empty_cache``
            x, _ = sublayer_connection(
                x,
                lambda h: (self.cross_attn.attend(h, cache.cross_attn, memory_mask), None),
                self.cross_attn_norm,
                norm_first,
                self.cross_attn_dropout,
            )  # (B, T_new, d_model)
        x, _ = sublayer_connection(
            x, lambda h: (self.ffn(h), None), self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T_new, d_model)
        return x, LayerCache(self_cache, cache.cross_attn)

    def _cross_attention_backward(self, grad_output: Array) -> tuple[Array, tuple]:
        """-> grad_h (B, T_tgt, d_model), (grads, grad_memory (B, T_src, d_model))."""
        # (B, T_tgt, d_model), (B, T_src, d_model), (B, T_src, d_model)
        (grad_query, grad_key, grad_value), grads = self.cross_attn.backward(grad_output)  # (B, T, d_model) each
        # the memory was both the key and the value: its gradient is the sum
        return grad_query, (grads, grad_key + grad_value)  # (B, T_tgt, d_model), (B, T_src, d_model)


def _check_memory(memory: Array | None, x: Array, d_model: int) -> None:
    if memory is None:
        raise ValueError("this decoder has cross-attention and needs memory (the encoder output), got None")
    check_hidden("memory", memory.shape, d_model)
    check_float_inputs(("x", "memory"), (x, memory))
    check_same_batch(("memory", "x"), (memory.shape, x.shape))


class Decoder(Module):
    """N decoder layers, then an optional final LayerNorm."""

    schema = "decoder"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.layers = [DecoderLayer(config, dtype) for _ in range(config.num_decoder_layers)]
        self.norm = make_norm(config, dtype) if config.decoder_final_norm else None

    def __call__(
        self,
        x: Array,
        memory: Array | None = None,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
    ) -> tuple[Array, tuple, tuple, tuple]:
        """-> (output, hidden states, self-attention weights per layer, cross-attention weights per layer)."""
        hidden_states, self_attentions, cross_attentions = [x], [], []
        for layer in self.layers:
            x, self_weights, cross_weights = layer(x, memory, tgt_mask, memory_mask, need_weights)  # (B, T_tgt, d)
            if need_hidden_states:  # else each layer's output is freed once the next layer has used it
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

    def backward(self, grad_output: Array) -> tuple[tuple[Array, Array | None], dict[str, Array]]:
        """grad_output (B, T_tgt, d_model) -> (grad_x (B, T_tgt, d_model), grad_memory (B, T_src, d_model)
        or None), grads of every layer and the final norm."""
        grads = {}
        if self.norm is not None:
            grad_output, norm_grads = self.norm.backward(grad_output)  # (B, T_tgt, d_model)
            grads |= with_prefix("norm", norm_grads)
        grad_memory = None
        for i in reversed(range(len(self.layers))):  # last layer first
            # (B, T_tgt, d_model), (B, T_src, d_model)
            (grad_output, layer_grad_memory), layer_grads = self.layers[i].backward(grad_output)  # (B, T, d_model)
            grads |= with_prefix(f"layers.{i}", layer_grads)
            if layer_grad_memory is not None:  # every layer read the same memory: the gradients add up
                earlier = 0.0 if grad_memory is None else grad_memory  # (B, T_src, d_model), or 0 at the last layer
                grad_memory = layer_grad_memory + earlier  # (B, T_src, d_model)
        return (grad_output, grad_memory), grads

    def empty_cache(self, batch: int, memory: Array | None = None) -> tuple[LayerCache, ...]:
        """One ``LayerCache`` per layer, before the first decoding step (see ``DecoderLayer.empty_cache``)."""
        return tuple(layer.empty_cache(batch, memory) for layer in self.layers)

    def step(
        self,
        x: Array,
        cache: tuple[LayerCache, ...],
        position: int,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
    ) -> tuple[Array, tuple[LayerCache, ...]]:
        """x (B, T_new, d_model) at positions position .. position + T_new - 1 -> the output at
        those positions (B, T_new, d_model), each layer's cache extended by them."""
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x, layer_cache = layer.step(x, layer_cache, position, tgt_mask, memory_mask)  # (B, T_new, d_model)
            new_cache.append(layer_cache)
        if self.norm is not None:
            x = self.norm(x)  # (B, T_new, d_model)
        return x, tuple(new_cache)
